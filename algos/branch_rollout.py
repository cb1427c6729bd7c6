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
import copy
import time

from orchard_gym.envs.forking import clone
from orchard_gym.envs.rollout import SYSTEM_PROMPT, play
from orchard_gym.images import observation_parts

from .agent_rollout import AgentSample, EpisodeRunner, _EpisodePolicy


def _copy_policy(policy: _EpisodePolicy) -> _EpisodePolicy:
    twin = copy.copy(policy)
    for name in ("completion_ids", "env_mask", "logprobs", "images", "image_starts"):
        setattr(twin, name, list(getattr(policy, name)))
    return twin


async def run_branched(runner: EpisodeRunner, task_id: str, n: int, at: int, max_steps: int,
                       max_seconds: float | None = None) -> list[AgentSample]:
    """`n` samples of `task_id` sharing the root's first `at` turns (see the module docstring)."""
    if at >= max_steps:
        raise ValueError(f"branch_at={at} is beyond the episode length (max_steps={max_steps})")
    client = await runner.client()
    started = time.monotonic()
    root_env = runner.make_env(client, max_steps, max_seconds)
    root = _EpisodePolicy(runner, list(root_env.tools))
    limit = None if max_seconds is None else max_seconds + runner.grace
    try:
        async with runner._gate:
            runner.generator.active += 1
            try:
                obs, info = await root_env.areset(options={"task_id": task_id})
                messages = [{"role": "system", "content": runner.system_prompt or SYSTEM_PROMPT},
                            {"role": "user", "content": observation_parts(obs)}]
                tools = info["tools"]
                await asyncio.wait_for(play(root_env, root, messages, tools, stop_at=at), limit)
                trajectory = root_env.trajectory
                if root_env._done or len(trajectory.turns) < at or trajectory.error:
                    trajectory.error = trajectory.error or f"the root episode ended before the branch point (turn {at})"
                    return [runner.sample(task_id, trajectory.model_copy(deep=True), root, started, max_steps,
                                          max_seconds) for _ in range(n)]
                snap = await root_env.asnapshot()
                await root_env._release_sandbox()  # the snapshot outlives the root's sandbox
            finally:
                runner.generator.active -= 1
        prefix = len(root.completion_ids)

        async def branch(i: int) -> AgentSample:
            async with runner._gate:
                runner.generator.active += 1
                env, policy = clone(root_env), _copy_policy(root)
                try:
                    await env.areset(options={"snapshot": snap})
                    env.trajectory.metadata["branch"] = {"at": at, "index": i}
                    trajectory = await asyncio.wait_for(play(env, policy, list(messages), tools), limit)
                except TimeoutError:
                    trajectory = env.trajectory
                    trajectory.error = f"aborted: the wall-clock budget of {max_seconds:.0f}s ran out"
                except Exception as e:  # one failed fork is one excluded sample
                    trajectory = env.trajectory or root_env.trajectory.model_copy(deep=True)
                    trajectory.error = f"fork failed: {type(e).__name__}: {e}"
                finally:
                    runner.generator.active -= 1
                    await env.aclose()
            sample = runner.sample(task_id, trajectory, policy, started, max_steps, max_seconds)
            sample.env_mask[:prefix] = [0] * min(prefix, len(sample.env_mask))  # the shared turns: no loss
            return sample

        return list(await asyncio.gather(*(branch(i) for i in range(n))))
    finally:
        await root_env.aclose()
