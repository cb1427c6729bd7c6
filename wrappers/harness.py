"""Harnesses: how to install one and how to start it inside a sandbox.

A harness is an agent program that owns its loop and calls an OpenAI-compatible model
API (mini-swe-agent, OpenHands, Codex, ...). `Harness` says which pip requirements it
needs (installed once into a cached venv on the host, which local sandboxes see
read-only, like the SWE tasks' test venvs) and which bash command starts it. The
command sees:

| variable | |
|---|---|
| `OPENAI_BASE_URL`, `OPENAI_API_BASE` | the rollout's model endpoint (the recording proxy) |
| `OPENAI_API_KEY` | the rollout's token |
| `ORCHARD_MODEL` | the model name to ask for |
| `ORCHARD_TASK_FILE` | a file holding the task text |
| `ORCHARD_HARNESS_DIR` | a scratch folder outside the repository (logs, the harness's own trajectory) |
| `ORCHARD_HARNESS_VENV` | the harness's venv (when it has requirements) |

It runs in the task's working directory with the task's environment (e.g. PATH with
the task's test venv first), so the commands it runs see what the task env's tools see.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MINI_SWE_AGENT_VERSION = "2.4.6"


class Harness(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    command: str = Field(description="bash that starts the harness (see the module docstring for its variables)")
    requirements: list[str] = Field(default_factory=list, description="pip requirements of its venv (pinned)")
    env: dict[str, str] = Field(default_factory=dict, description="more environment; '{harness_dir}' and "
                                "'{venv}' in values are filled in")
    ok_exit_codes: list[int] = Field([0], description="exit codes of a run that ended normally")

    def install(self) -> Path | None:
        """Build (once, cached, under a lock) the venv with `requirements`; None if it has none."""
        if not self.requirements:
            return None
        from orchard_gym.envs.swe.venvs import cache_root, ensure_venv

        return ensure_venv(self.requirements, root=cache_root() / "harness" / "venvs")

    def task_text(self, env: Any, task: Any) -> str:
        """What the harness is asked to do: the issue text where the task has one, else the
        task env's first observation."""
        text = getattr(task, "problem_statement", None)
        return text.strip() if isinstance(text, str) and text.strip() else env.first_observation(task)

    def environment(self, harness_dir: str, venv: str | None) -> dict[str, str]:
        return {k: v.replace("{harness_dir}", harness_dir).replace("{venv}", venv or "") for k, v in self.env.items()}


MINI_SWE_AGENT = Harness(
    name="mini-swe-agent",
    requirements=[f"mini-swe-agent=={MINI_SWE_AGENT_VERSION}"],
    # the real `mini` CLI, non-interactive: the default (non-interactive) agent class, yolo
    # mode, no confirmation at exit, no cost limit; the model through litellm's OpenAI
    # provider at the proxy, tool calling (its `bash` tool); submit = `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`
    command=('"$ORCHARD_HARNESS_VENV/bin/mini" --agent-class default -y --exit-immediately --cost-limit 0 '
             '-c mini.yaml -c model.cost_tracking=ignore_errors '
             '-c "model.model_kwargs.api_base=$OPENAI_BASE_URL" -c "model.model_kwargs.api_key=$OPENAI_API_KEY" '
             '-m "openai/$ORCHARD_MODEL" -o "$ORCHARD_HARNESS_DIR/trajectory.json" -t "$(cat "$ORCHARD_TASK_FILE")"'),
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

HARNESSES: dict[str, Harness] = {MINI_SWE_AGENT.name: MINI_SWE_AGENT}


def get_harness(spec: str | dict | Harness) -> Harness:
    """A harness by name ('mini-swe-agent'), from a dict, or as given."""
    if isinstance(spec, Harness):
        return spec
    if isinstance(spec, dict):
        return Harness.model_validate(spec)
    try:
        return HARNESSES[spec]
    except KeyError:
        raise ValueError(f"unknown harness {spec!r}; known: {sorted(HARNESSES)} (or pass a Harness)") from None

from .harnesses import claude_code  # noqa: E402,F401 - registers itself in HARNESSES
