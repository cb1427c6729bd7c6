"""Run many episodes concurrently from one process, with an async policy.

    async def policy(messages, tools):          # OpenAI-style chat messages and tool schemas
        return {"name": "submit", "arguments": {}}

    trajectories = await run_episodes(lambda client: SWEEnv(client=client), policy,
                                      task_ids, concurrency=16)

The policy sees the conversation so far; its action (text or a tool-call dict) is
appended as the assistant's turn and the env's observation as the reply, so a chat
model can be plugged in directly. Every env shares one sandbox client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from tqdm.auto import tqdm

from orchard_gym.client import AsyncSandboxClient
from orchard_gym.trajectory import Trajectory

from .base import SandboxEnv
from .branching import run_trees
from .episode import (SYSTEM_PROMPT, Policy, ScreenshotSink, assistant_message, observation_message,
                      observation_messages, play, run_episode)

__all__ = ["SYSTEM_PROMPT", "Policy", "ScreenshotSink", "assistant_message", "observation_message",
           "observation_messages", "play", "run_episode", "run_episodes"]

async def run_episodes(make_env: Callable[[AsyncSandboxClient], SandboxEnv], policy: Policy,
                       task_ids: Sequence[str], *, concurrency: int = 8, client: AsyncSandboxClient | None = None,
                       progress: bool = True, record_messages: bool = False, screenshots: ScreenshotSink | None = None,
                       on_done: Callable[[Trajectory], None] | None = None,
                       branch_at: int | Sequence[int] | None = None, branches: int = 4) -> list[Trajectory]:
    """Run one episode per task id (repeat ids for several samples), `concurrency` at a time.
    Results come back in the order of `task_ids`. With `branch_at` (turn k, or several), each
    episode forks `branches` continuations at turn k (`envs/branching.py`): every tree's root
    comes first, then its branches, linked by `metadata["branch"]`; roots carry Monte Carlo values."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if branch_at is not None:
        trees = await run_trees(make_env, policy, task_ids, branch_at=branch_at, branches=branches,
                                concurrency=concurrency, client=client, progress=progress,
                                record_messages=record_messages, screenshots=screenshots)
        flat = [t for tree in trees for t in tree.trajectories()]
        for t in flat if on_done is not None else ():
            on_done(t)
        return flat
    own_client = client is None
    client = client or AsyncSandboxClient()
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(task_ids), desc="episodes", disable=not progress, unit="ep")

    async def one(task_id: str) -> Trajectory:
        async with gate:
            env = make_env(client)
            try:
                trajectory = await run_episode(env, policy, task_id, record_messages=record_messages,
                                               screenshots=screenshots)
            finally:
                await env.aclose()
        bar.update(1)
        if on_done is not None:
            on_done(trajectory)
        return trajectory

    try:
        return list(await asyncio.gather(*(one(t) for t in task_ids)))
    finally:
        bar.close()
        if own_client:
            await client.aclose()
