"""OpenHands (PyPI `openhands-sdk` + `openhands-tools`): its default coding agent, headless,
through a small driver (`openhands_driver.py`, shipped as the harness's `driver.py`): a local
conversation on the task's working directory with the terminal, file-editor and task-tracker
tools, its LLM litellm's OpenAI chat-completions provider at the proxy (`openai/$ORCHARD_MODEL`,
the rollout's token as the key), at most `max_steps` agent iterations. OpenHands needs
Python >= 3.12: its venv is built on Debian trixie's python3.13, bundled in the venv
(wrappers/harness/python.py), so it runs on the bookworm host, in local sandboxes and in
docker ones whatever python the task image has. It ends its run with its `finish` tool."""

from pathlib import Path

from ..spec import Harness

VERSION = "1.58.2"
DRIVER = (Path(__file__).parent / "openhands_driver.py").read_text()

HARNESS = Harness(
    name="openhands",
    python="3.13",
    requirements=[f"openhands-sdk=={VERSION}", f"openhands-tools=={VERSION}"],
    files={"driver.py": DRIVER},
    command='"$ORCHARD_HARNESS_VENV/bin/python" "$ORCHARD_HARNESS_DIR/driver.py"',
    shell_tool="terminal", shell_argument="command",
    finish={"name": "finish", "arguments": {"message": "Done."}},
    env={
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download of litellm's price list
        "LITELLM_LOG": "ERROR",
        "LOG_LEVEL": "WARNING",
        "OPENHANDS_SUPPRESS_BANNER": "1",
        "OH_PERSISTENCE_DIR": "{harness_dir}/openhands",
        "TMUX_TMPDIR": "{harness_dir}",
        "PAGER": "cat", "MANPAGER": "cat", "GIT_PAGER": "cat", "TQDM_DISABLE": "1",
        "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "200",
    },
)
