"""GRPO groups forked at turn K: the per-turn advantage option (`AgentGRPOArgs.branch_at`).

One root episode of the model being trained plays K turns; its sandbox state is
snapshotted (envs/forking.py) and the group's G episodes are continuations forked from
it, each with a copy of the root's token sequence. TRL's group-relative advantage
`R_i - mean_j R_j` is then `R_i - V̂(s_K)`, the return of the continuation against the
Monte Carlo value of the shared state: an advantage of the actions from turn K on, not of
the whole episode. The shared prefix (turns before K) carries no loss: its tokens are in
every sample with `env_mask` 0. A root that ends before turn K gives a group of excluded
samples (never trained on), so the group is dropped or replaced like any uninformative one.
"""

from __future__ import annotations

import asyncio
import time

from orchard_gym.envs.branching import run_branch, snapshot_at
from orchard_gym.envs.episode import SYSTEM_PROMPT, first_messages

from .agent_rollout import AgentSample, EpisodePolicy, EpisodeRunner


async def run_branched(runner: EpisodeRunner, task_id: str, n: int, at: int, max_steps: int,
                       max_seconds: float | None = None) -> list[AgentSample]:
    """`n` samples of `task_id` sharing the root's first `at` turns (see the module docstring).
    The branch point and the continuations are envs/branching.py's (`snapshot_at`, `run_branch`)."""
    if at >= max_steps:
        raise ValueError(f"branch_at={at} is beyond the episode length (max_steps={max_steps})")
    client = await runner.client()
    started = time.monotonic()
    root_env = runner.make_env(client, max_steps, max_seconds)
    root = EpisodePolicy(runner, list(root_env.tools))
    limit = None if max_seconds is None else max_seconds + runner.grace
    try:
        async with runner.slot():
            obs, info = await root_env.areset(options={"task_id": task_id})
            messages = first_messages(obs, runner.system_prompt or SYSTEM_PROMPT)
            tools = info["tools"]
            snap = await asyncio.wait_for(snapshot_at(root_env, root, messages, tools, at), limit)
            if snap is None:
                trajectory = root_env.trajectory
                trajectory.error = trajectory.error or f"the root episode ended before the branch point (turn {at})"
                return [runner.sample(task_id, trajectory.model_copy(deep=True), root, started, max_steps,
                                      max_seconds) for _ in range(n)]
            await root_env.release_sandbox()  # the snapshot outlives the root's sandbox
        prefix = len(root.completion_ids)

        async def branch(i: int) -> AgentSample:
            policy = root.fork()
            async with runner.slot():
                trajectory = await run_branch(root_env, snap, policy, messages, tools, {"at": at, "index": i},
                                              timeout=limit)
            sample = runner.sample(task_id, trajectory, policy, started, max_steps, max_seconds)
            sample.env_mask[:prefix] = [0] * min(prefix, len(sample.env_mask))  # the shared turns: no loss
            return sample

        return list(await asyncio.gather(*(branch(i) for i in range(n))))
    finally:
        await root_env.aclose()
