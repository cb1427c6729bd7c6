"""The async base of orchard-gym's Gymnasium wrappers (the env their examples use: echo.py).

Orchard envs are async at heart (`areset`/`astep`/`aclose`; the sync methods run them on
a background loop), so the wrappers are too: `AsyncWrapper`'s async twins call the inner
env's async methods (through Gymnasium's own wrappers, e.g. those `gym.make` adds) and
its `reset`/`step`/`close` run them on the shared loop. A wrapper changes one thing.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from orchard_gym._loop import LoopThread, run_in_thread


def async_target(env: gym.Env) -> gym.Env:
    """The outermost env in the chain that has async methods (or the innermost env)."""
    while not hasattr(env, "astep") and isinstance(env, gym.Wrapper):
        env = env.env
    return env


class AsyncWrapper(gym.Wrapper):
    """A `gym.Wrapper` whose real methods are `areset`, `astep` and `aclose`."""

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        inner = async_target(self.env)
        if hasattr(inner, "areset"):
            return await inner.areset(seed=seed, options=options)
        return await run_in_thread(lambda: inner.reset(seed=seed, options=options))

    async def astep(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        inner = async_target(self.env)
        if hasattr(inner, "astep"):
            return await inner.astep(action)
        return await run_in_thread(inner.step, action)

    async def aclose(self) -> None:
        inner = async_target(self.env)
        if hasattr(inner, "aclose"):
            await inner.aclose()
        else:
            await run_in_thread(inner.close)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        return LoopThread.shared().run(self.areset(seed=seed, options=options))

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        return LoopThread.shared().run(self.astep(action))

    def close(self) -> None:
        LoopThread.shared().run(self.aclose())
