"""`EchoEnv`: a tiny async text env without a sandbox, for the wrappers' examples and tests
(the sandboxed toy domain is `orchard_gym.envs.toy.ToyEnv`, Orchard/Toy-v0)."""

from __future__ import annotations

import asyncio
from typing import Any

import gymnasium as gym

from orchard_gym._loop import LoopThread
from orchard_gym.envs.spaces import UnicodeText


class EchoEnv(gym.Env):
    """A tiny async text env for examples and tests: each step echoes the action; the
    episode terminates after `length` steps with `reward`. `delay` seconds per step;
    `fail_at` makes that step end the episode with `info["error"]` (an infrastructure
    failure, as a crashed sandbox would).

    >>> env = EchoEnv(length=2, reward=1.0)
    >>> env.reset(seed=0)[0]
    'start'
    >>> env.step("a")[:4], env.step("b")[:4]
    (('a', 0.0, False, False), ('b', 1.0, True, False))
    """

    metadata = {"render_modes": []}

    def __init__(self, length: int = 3, reward: float = 1.0, delay: float = 0.0, fail_at: int | None = None):
        self.length, self.reward, self.delay, self.fail_at = length, reward, delay, fail_at
        self.observation_space = UnicodeText(10_000)
        self.action_space = UnicodeText(10_000)
        self.t = 0
        self.aborted: str | None = None

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self.t, self.aborted = 0, None
        return "start", {}

    async def astep(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        await asyncio.sleep(self.delay)
        self.t += 1
        if self.fail_at is not None and self.t >= self.fail_at:
            return str(action), 0.0, False, True, {"error": "the toy sandbox died"}
        done = self.t >= self.length
        return str(action), self.reward if done else 0.0, done, False, {}

    async def abort(self, reason: str) -> tuple[str, float, bool, bool, dict]:
        self.aborted = reason
        return "", 0.0, False, True, {"error": reason}

    async def aclose(self) -> None:
        pass

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        return LoopThread.shared().run(self.areset(seed=seed, options=options))

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        return LoopThread.shared().run(self.astep(action))
