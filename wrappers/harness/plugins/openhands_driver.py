"""The OpenHands driver, run *in the sandbox* by the harness's venv python (Debian's 3.13, see
wrappers/harness/python.py), never imported on the host (its imports are inside `main`).

OpenHands' default coding agent (`openhands.tools.preset.default`: terminal, file editor,
task tracker, the built-in finish/think tools; no browser, as its CLI mode) in a local
conversation on the working directory, its LLM litellm's OpenAI chat-completions provider at
the recording proxy. Everything comes from the environment the env sets:
OPENAI_BASE_URL, OPENAI_API_KEY, ORCHARD_MODEL, ORCHARD_MAX_STEPS, ORCHARD_TASK_FILE,
ORCHARD_HARNESS_DIR. Exit 0 when the agent finished (or stopped at its step budget),
3 when the conversation ended in error or stuck; an exception is a crash (exit 1)."""

import os
import sys


def main() -> int:
    from openhands.sdk import LLM, Agent, Conversation, Tool
    from openhands.sdk.conversation.state import ConversationExecutionStatus
    from openhands.tools.file_editor import FileEditorTool
    from openhands.tools.preset.default import get_default_condenser
    from openhands.tools.task_tracker import TaskTrackerTool
    from openhands.tools.terminal import TerminalTool

    llm = LLM(model="openai/" + os.environ["ORCHARD_MODEL"], base_url=os.environ["OPENAI_BASE_URL"],
              api_key=os.environ["OPENAI_API_KEY"], usage_id="agent", native_tool_calling=True,
              num_retries=0,  # the proxy answers each call once: a retry would be a second call
              timeout=None)   # the env owns the wall clock
    # get_default_agent(llm, cli_mode=True), with the terminal as a plain pty (no tmux server)
    agent = Agent(llm=llm, tools=[Tool(name=TerminalTool.name, params={"terminal_type": "subprocess"}),
                                  Tool(name=FileEditorTool.name), Tool(name=TaskTrackerTool.name)],
                  system_prompt_kwargs={"cli_mode": True},
                  condenser=get_default_condenser(llm.model_copy(update={"usage_id": "condenser"})))
    harness_dir = os.environ["ORCHARD_HARNESS_DIR"]
    conversation = Conversation(agent=agent, workspace=os.getcwd(),
                                persistence_dir=os.path.join(harness_dir, "conversation"),
                                max_iteration_per_run=int(os.environ.get("ORCHARD_MAX_STEPS", "100")),
                                visualizer=None)
    with open(os.environ["ORCHARD_TASK_FILE"], encoding="utf-8") as f:
        conversation.send_message(f.read())
    conversation.run()
    status = conversation.state.execution_status
    print(f"orchard: openhands ended {status.value}", file=sys.stderr)
    return 3 if status in (ConversationExecutionStatus.ERROR, ConversationExecutionStatus.STUCK) else 0


if __name__ == "__main__":
    sys.exit(main())
