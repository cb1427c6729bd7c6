"""A scripted stochastic policy on Orchard/Toy-v0 whose success probability from every state
is known in closed form: the reference for branching rollouts' Monte Carlo values.

The task ("progress" tasks, `progress_tasks`): make `progress.txt` hold at least `need`
lines, then submit. The policy plays `len(p)` bash turns and then submits; at turn t it
appends a line with probability p[t] (`echo step >> progress.txt`) and does nothing
useful otherwise (`true`). So from the state s_k after k turns, with c lines written,

    V(s_k) = P(c + X_k + ... + X_{T-1} >= need),   X_t ~ Bernoulli(p[t]) independent,

and `success_probability(p, need, k, c)` computes it exactly. The state lives in the
sandbox's file, so a fork that lost files (or shared them between forks) shows up as
Monte Carlo values off the analytic ones.

Randomness is seeded per episode: `bind(env)` draws from `(seed, task, branch)` where the
branch is `trajectory.metadata["branch"]` (tree number, turn, index: set by the tree runner), so a run is
reproducible and every continuation draws independently.

    from orchard_gym.envs.toy.stochastic import StochasticProgressPolicy, progress_tasks
    env = ToyEnv(backend={"type": "local"}, tasks=progress_tasks(need=2))
    tree = await run_tree(lambda c: ToyEnv(client=c, tasks=progress_tasks(need=2)),
                          StochasticProgressPolicy([0.5, 0.3, 0.8]), "progress-000", branch_at=[0, 1, 2], branches=16)
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from .env import ToyTask

STEP = "echo step >> progress.txt"
NOTHING = "true"


def progress_tasks(need: int = 2, num_tasks: int = 1) -> dict[str, ToyTask]:
    if need < 0:
        raise ValueError("need must be >= 0")
    check = f'test "$(cat progress.txt 2>/dev/null | wc -l)" -ge {need}'
    return {f"progress-{i:03d}": ToyTask(
        task_id=f"progress-{i:03d}", kind="write", answer=str(need), check=check, solution=STEP,
        instruction=f"Make progress.txt hold at least {need} lines.") for i in range(num_tasks)}


def success_probability(p: Sequence[float], need: int, k: int = 0, done: int = 0) -> float:
    """P(done + sum of Bernoulli(p[t]) for t >= k >= need): exact, by dynamic programming."""
    dist = {done: 1.0}  # lines written -> probability
    for q in p[k:]:
        nxt: dict[int, float] = {}
        for c, w in dist.items():
            nxt[c + 1] = nxt.get(c + 1, 0.0) + w * q
            nxt[c] = nxt.get(c, 0.0) + w * (1 - q)
        dist = nxt
    return sum(w for c, w in dist.items() if c >= need)


def steps_done(turns: Sequence[Any], k: int) -> int:
    """Lines the policy wrote in the first k turns of a trajectory."""
    return sum(1 for t in turns[:k] if (t.arguments or {}).get("command") == STEP)


class StochasticProgressPolicy:
    """At turn t < len(p): `echo step >> progress.txt` with probability p[t], else `true`; then submit."""

    def __init__(self, p: Sequence[float], seed: int = 0, env: Any = None):
        if not p or any(not 0.0 <= q <= 1.0 for q in p):
            raise ValueError("p is a non-empty list of probabilities in [0, 1]")
        self.p, self.seed, self.env = list(p), seed, env
        branch = (env.trajectory.metadata.get("branch") if env is not None and env.trajectory else None) or {}
        task = env.trajectory.task_id if env is not None and env.trajectory else None
        self.rng = random.Random(json.dumps([seed, task, branch.get("seq"), branch.get("at"), branch.get("index")]))

    def bind(self, env: Any) -> StochasticProgressPolicy:
        return StochasticProgressPolicy(self.p, self.seed, env)

    async def __call__(self, messages: list[dict], tools: list[dict]) -> Any:
        t = sum(1 for m in messages if m["role"] == "assistant")
        if t >= len(self.p):
            return {"name": "submit", "arguments": {}}
        return {"name": "bash", "arguments": {"command": STEP if self.rng.random() < self.p[t] else NOTHING}}
