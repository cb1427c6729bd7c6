"""Reward wrappers: terminal-reward discounting (OpenForge RL eq. 1) and shaping hooks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from .base import AsyncWrapper
from .proxy.reconstruct import discounted


class DiscountedTerminalReward(AsyncWrapper):
    """At the end of an episode, spread the terminal reward back over its steps:
    `info["step_rewards"][t] = γ^(T−t)·r_T`, as the recording proxy's trajectory
    reconstruction does for model calls. Step rewards themselves are unchanged. An
    episode that ended in an error gets `info["step_rewards"] = None`: no made-up signal.

    >>> from orchard_gym.wrappers import DiscountedTerminalReward, EchoEnv
    >>> env = DiscountedTerminalReward(EchoEnv(length=3, reward=1.0), gamma=0.5)
    >>> _ = env.reset(seed=0)
    >>> for action in "abc":
    ...     obs, reward, terminated, truncated, info = env.step(action)
    >>> info["step_rewards"]
    [0.25, 0.5, 1.0]
    """

    def __init__(self, env: gym.Env, gamma: float = 1.0):
        if not 0.0 <= gamma <= 1.0:
            raise ValueError("gamma must be in [0, 1]")
        super().__init__(env)
        self.gamma = gamma
        self._steps = 0

    async def areset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        self._steps = 0
        return await super().areset(seed=seed, options=options)

    async def astep(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = await super().astep(action)
        self._steps += 1
        if terminated or truncated:
            info = {**info, "step_rewards": None if info.get("error") else discounted(reward, self._steps, self.gamma)}
        return obs, reward, terminated, truncated, info


class ShapeReward(AsyncWrapper):
    """Reward shaping hook: `reward = fn(reward, obs, info)` on every step that did not end
    in an error (those keep their 0.0: shaping must not invent signal for them).

    >>> from orchard_gym.wrappers import ShapeReward, EchoEnv
    >>> env = ShapeReward(EchoEnv(length=2, reward=1.0), lambda r, obs, info: r - 0.01)  # a step cost
    >>> _ = env.reset(seed=0)
    >>> [round(env.step(a)[1], 2) for a in "ab"]
    [-0.01, 0.99]
    """

    def __init__(self, env: gym.Env, fn: Callable[[float, Any, dict], float]):
        super().__init__(env)
        self.fn = fn

    async def astep(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = await super().astep(action)
        if not info.get("error"):
            reward = float(self.fn(reward, obs, info))
        return obs, reward, terminated, truncated, info
