"""The error filter for trainers (OpenForge RL §3.2, after DAPO): an episode that ended
in an infrastructure error is dropped, never trained on with a misleading reward."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from .base import AsyncWrapper


class ErrorFilter(AsyncWrapper):
    """Flag episodes that ended in an error (harness crash, timeout, network or proxy
    failure, dead sandbox: anything with `info["error"]`) so a trainer discards them:
    the final step gets `info["discard"] = True` and reward 0.0, and the wrapper counts
    `episodes` and `discarded`. Every other step gets `info["discard"] = False`. For
    recorded trajectories and samples use `drop_errors(...)` instead.

    >>> from orchard_gym.wrappers import ErrorFilter, EchoEnv
    >>> env = ErrorFilter(EchoEnv(length=3, fail_at=2))
    >>> _ = env.reset(seed=0)
    >>> env.step("a")[4]["discard"]
    False
    >>> obs, reward, terminated, truncated, info = env.step("b")
    >>> reward, truncated, info["discard"], info["error"], env.discarded
    (0.0, True, True, 'the toy sandbox died', 1)
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.episodes = 0
        self.discarded = 0

    async def astep(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = await super().astep(action)
        discard = bool(info.get("error"))
        if terminated or truncated:
            self.episodes += 1
            self.discarded += discard
        if discard:
            reward = 0.0
        return obs, reward, terminated, truncated, {**info, "discard": discard}
