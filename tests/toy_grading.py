"""A Toy env whose grade alternates 1, 0, 1, ... per task (the real check still runs in the
sandbox): a random tiny model never solves a task, and a GRPO group needs both outcomes."""

from __future__ import annotations

import collections

from orchard_gym.envs.toy.env import ToyEnv


class AlternatingToy(ToyEnv):
    counts: collections.Counter = collections.Counter()  # gradings per task id; reset per test

    async def grade(self, ctx, task):
        _, report = await super().grade(ctx, task)
        type(self).counts[task.task_id] += 1
        return float(type(self).counts[task.task_id] % 2), report
