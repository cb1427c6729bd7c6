"""Wall-clock timeout per rollout (OpenForge RL §3.2): turn limits are unreliable across
harnesses, so each rollout gets a (generous) wall-clock budget instead."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import gymnasium as gym

from .base import AsyncWrapper


class WallClockTimeout(AsyncWrapper):
    """End an episode that runs past `max_seconds` of wall-clock time since `reset`.

    A step still running at the deadline is cancelled; the env's `abort(reason)` then kills
    what runs (a harness, a sandbox's commands) and marks the episode. The step returns
    `truncated=True`, reward 0.0 and `info["error"]` starting with "timeout", so trainers
    drop the episode (see `ErrorFilter`) instead of learning from a cut-off rollout.

    >>> from orchard_gym.wrappers import EchoEnv, WallClockTimeout
    >>> env = WallClockTimeout(EchoEnv(length=5, delay=0.2), max_seconds=0.3)
    >>> _ = env.reset(seed=0)
    >>> env.step("a")[:4]
    ('a', 0.0, False, False)
    >>> obs, reward, terminated, truncated, info = env.step("b")
    >>> reward, terminated, truncated, info["error"]
    (0.0, False, True, 'timeout: the rollout ran past its wall-clock budget of 0.3s')
    """

    def __init__(self, env: gym.Env, max_seconds: float):
        if max_seconds <= 0:
            raise ValueError("max_seconds must be positive")
        super().__init__(env)
        self.max_seconds = max_seconds
        self._deadline: float | None = None

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        self._deadline = time.monotonic() + self.max_seconds
        return await super().areset(seed=seed, options=options)

    async def astep(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if self._deadline is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            return await self._expire()
        try:
            return await asyncio.wait_for(super().astep(action), remaining)
        except TimeoutError:
            return await self._expire()

    async def _expire(self) -> tuple[Any, float, bool, bool, dict]:
        reason = f"timeout: the rollout ran past its wall-clock budget of {self.max_seconds:g}s"
        self._deadline = time.monotonic()  # every later step expires at once, until reset
        target = self.env.unwrapped
        if hasattr(target, "abort"):  # a SandboxEnv or a HarnessEnv: kill what runs, mark the episode
            obs, _, _, _, info = await target.abort(reason)
        else:
            obs, info = "", {}
        return obs, 0.0, False, True, {**info, "error": reason}
