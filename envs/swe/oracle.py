"""The SWE oracle: apply the task's gold patch, then submit (`orchard eval --policy oracle`): it
checks tasks and graders end to end. The patch command is shared with harness evaluations,
which send it through a harness's own shell (wrappers/harness/eval.py)."""

from __future__ import annotations

from typing import Any

GOLD_PATCH_EOF = "ORCHARD_GOLD_PATCH_EOF"


def apply_patch_command(patch: str) -> str:
    """The bash that applies `patch` in the repository (a quoted here-document: nothing expands)."""
    return f"git apply <<'{GOLD_PATCH_EOF}'\n{patch}\n{GOLD_PATCH_EOF}"


class SWEOraclePolicy:
    """Applies the task's gold patch, then submits. It needs the episode's task, so the runner
    binds it to each env (`bind`)."""

    def __init__(self, env: Any = None):
        self.env = env

    def bind(self, env: Any) -> SWEOraclePolicy:
        return SWEOraclePolicy(env)

    async def __call__(self, messages: list[dict], tools: list[dict]) -> Any:
        if self.env is None:
            raise ValueError("the oracle policy must be bound to an env: policy.bind(env)")
        if not any(m["role"] == "assistant" for m in messages):
            return {"name": "bash", "arguments": {"command": apply_patch_command(self.env.task.patch)}}
        return {"name": "submit", "arguments": {}}
