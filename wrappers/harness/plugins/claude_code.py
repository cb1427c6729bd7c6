"""Claude Code (npm `@anthropic-ai/claude-code`: a launcher and one self-contained native
binary per platform, so the sandbox needs no Node), unchanged and headless (`claude -p`),
its model calls going to the proxy's Anthropic Messages door: `ANTHROPIC_BASE_URL` is the
rollout's root (the client adds `/v1/messages`), `ANTHROPIC_API_KEY` the rollout token.
Telemetry, error reports, auto-update and non-essential traffic and model calls are off,
and the small/fast model is the rollout's model too, so all its calls are recorded. Its
permission prompts are skipped (`IS_SANDBOX=1` allows that as root): the task's sandbox is
the boundary. The session transcript (stream-json) goes to harness.log."""

from ..spec import Harness

VERSION = "2.1.332"

HARNESS = Harness(
    name="claude-code",
    npm=[f"@anthropic-ai/claude-code@{VERSION}"],
    model_url_env={"ANTHROPIC_BASE_URL": "{root}"},
    command=('ANTHROPIC_API_KEY="$OPENAI_API_KEY" claude -p "$(cat "$ORCHARD_TASK_FILE")" '
             '--output-format stream-json --verbose --model "$ORCHARD_MODEL" --dangerously-skip-permissions '
             '--max-turns 100 < /dev/null'),
    # docker/kubernetes: the native binary and the `claude` link to it (nothing else of the package is used)
    sandbox_payload=["node_modules/@anthropic-ai/claude-code/bin/claude.exe", "node_modules/.bin/claude"],
    shell_tool="Bash", shell_argument="command",
    finish="Done.",  # a turn without tool use ends `claude -p`
    env={
        "CLAUDE_CONFIG_DIR": "{harness_dir}/claude",      # its settings and session files, not $HOME's
        "ANTHROPIC_SMALL_FAST_MODEL": "{model}", "ANTHROPIC_DEFAULT_HAIKU_MODEL": "{model}",
        "IS_SANDBOX": "1",
        "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_NON_ESSENTIAL_MODEL_CALLS": "1",
        "DISABLE_COST_WARNINGS": "1", "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
        "NO_COLOR": "1", "TERM": "dumb", "PAGER": "cat",
    },
)
