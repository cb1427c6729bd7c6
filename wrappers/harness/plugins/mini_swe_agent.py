"""mini-swe-agent (PyPI `mini-swe-agent`), its real `mini` CLI, non-interactive: the default
agent class, yolo mode, no confirmation at exit, no cost limit; the model through litellm's
OpenAI provider at the proxy, tool calling (its `bash` tool). It submits with
`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`."""

from ..spec import Harness

VERSION = "2.4.6"

HARNESS = Harness(
    name="mini-swe-agent",
    requirements=[f"mini-swe-agent=={VERSION}"],
    command=('"$ORCHARD_HARNESS_VENV/bin/mini" --agent-class default -y --exit-immediately --cost-limit 0 '
             '-c mini.yaml -c model.cost_tracking=ignore_errors '
             '-c "model.model_kwargs.api_base=$OPENAI_BASE_URL" -c "model.model_kwargs.api_key=$OPENAI_API_KEY" '
             '-m "openai/$ORCHARD_MODEL" -o "$ORCHARD_HARNESS_DIR/trajectory.json" -t "$(cat "$ORCHARD_TASK_FILE")"'),
    finish={"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}},
    env={
        "MSWEA_CONFIGURED": "true",            # no first-run set-up prompt
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_COST_TRACKING": "ignore_errors",  # our model has no price
        "MSWEA_GLOBAL_CONFIG_DIR": "{harness_dir}/config",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download of litellm's price list
        "LITELLM_LOG": "ERROR",
        "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "3",
        "PAGER": "cat", "MANPAGER": "cat", "TQDM_DISABLE": "1", "PIP_PROGRESS_BAR": "off",
        "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "200",
    },
)
