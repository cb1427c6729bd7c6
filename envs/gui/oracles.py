"""Scripted oracles: they read the page (DOM geometry, texts) and act ONLY through the
computer_use actions, at coordinates they compute, like a user who can see the page.
They never call page functions to set an answer.

Each MiniWoB oracle is an async generator over (env) yielding actions; a desktop task's
oracle is its list of actions (data, in the task file).
"""

from __future__ import annotations

from typing import Any

from . import oracles_miniwob  # noqa: F401  (registers the MiniWoB oracles)
from .oracle_page import ORACLES, OracleError, Page, find, key, oracle, quoted, type_

__all__ = ["ORACLES", "GUIOraclePolicy", "OracleError", "Page", "find", "key", "oracle", "quoted", "type_"]


class GUIOraclePolicy:
    """`orchard eval --policy oracle`: plays the task's oracle, then terminates."""

    def __init__(self, env=None):
        self.env, self._gen, self._plan = env, None, None

    def bind(self, env) -> GUIOraclePolicy:
        return GUIOraclePolicy(env)

    async def __call__(self, messages: list[dict], tools: list[dict]) -> Any:
        task = self.env.task
        if task.kind == "desktop":
            done = sum(1 for m in messages if m["role"] == "assistant")
            plan = task.oracle
            return plan[done] if done < len(plan) else {"name": "terminate", "arguments": {"status": "success"}}
        if self._gen is None:
            self._gen = ORACLES[task.oracle](Page(self.env))
        try:
            return await self._gen.__anext__()
        except StopAsyncIteration:
            return {"name": "terminate", "arguments": {"status": "success"}}

