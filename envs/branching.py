"""Branching rollouts: G continuations forked from the exact sandbox state at turn k, and the
per-turn Monte Carlo values they give.

    tree = await run_tree(lambda c: ToyEnv(client=c), policy, "write-000", branch_at=[0, 1, 2], branches=8)
    tree.values()            # V(s_0) .. V(s_T) of the root path: share of successful continuations, None unbranched
    tree.root.turns[1].mc_value, tree.points[1].successes, tree.points[1].trajectories

The root episode runs to turn k (k actions done, action k not yet taken), the env's state
is snapshotted (`env.asnapshot()`), and `branches` continuations restored from it run to
their end with their own copy of the conversation and trajectory so far; the root goes
on to the next branch point and its end. The value of state s_k is the share of
continuations from s_k that succeed (`success(trajectory)`, default reward > 0) among
those that ended without an infrastructure error; it is written into the root's
`turns[k].mc_value` / `mc_samples` and `metadata["mc_values"]` ({k: value}). Branches
do not branch again. The root is not counted among the samples (it is shared by every
branch point, which would correlate their estimates).

`concurrency` bounds the episodes running at once (the root and its continuations
alike); a continuation's sandbox is created only when it gets a slot.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import BaseModel, Field
from tqdm.auto import tqdm

from orchard_gym.client import AsyncSandboxClient
from orchard_gym.screenshots import observation_text
from orchard_gym.trajectory import Trajectory

from .base import SandboxEnv
from .forking import EnvSnapshot
from .episode import SYSTEM_PROMPT, Policy, ScreenshotSink, first_messages, play


class BranchError(ValueError):
    """Branching arguments that cannot work (checked before any sandbox is made)."""


class BranchPoint(BaseModel):
    """The continuations forked at state s_k of the root path and their Monte Carlo value."""

    at: int = Field(description="turn k: the state after k actions of the root")
    trajectories: list[Trajectory] = Field(default_factory=list)
    successes: int = 0
    samples: int = Field(0, description="continuations that ended without an infrastructure error")
    value: float | None = Field(None, description="successes / samples (None when no continuation counted)")
    error: str | None = Field(None, description="why no continuation was forked here (e.g. the root ended first)")


class EpisodeTree(BaseModel):
    """One root episode and the continuations forked from it."""

    tree_id: str
    task_id: str
    root: Trajectory
    points: dict[int, BranchPoint] = Field(default_factory=dict)

    def values(self) -> list[float | None]:
        """V(s_0) .. V(s_T) along the root path (T = its turns): the Monte Carlo value where it was
        branched, the outcome (1.0/0.0) at the end, None elsewhere."""
        out: list[float | None] = [None] * (len(self.root.turns) + 1)
        for k, point in self.points.items():
            if k < len(out):
                out[k] = point.value
        if self.root.ok and (self.root.terminated or self.root.truncated):
            out[-1] = 1.0 if self.root.reward > 0 else 0.0
        return out

    def trajectories(self) -> list[Trajectory]:
        """The root, then every branch point's continuations in order of k."""
        return [self.root] + [t for k in sorted(self.points) for t in self.points[k].trajectories]


def check_branching(branch_at: int | Sequence[int], branches: int, max_steps: int | None = None) -> list[int]:
    """The sorted branch points; a `BranchError` saying what is wrong otherwise."""
    if isinstance(branches, bool) or not isinstance(branches, int) or branches < 1:
        raise BranchError(f"branches must be a whole number >= 1, not {branches!r}")
    points = [branch_at] if isinstance(branch_at, int) and not isinstance(branch_at, bool) else branch_at
    if isinstance(points, (str, bytes)) or not isinstance(points, Sequence) or not points:
        raise BranchError(f"branch_at must be a turn (int >= 0) or a non-empty list of turns, not {branch_at!r}")
    for k in points:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise BranchError(f"branch_at turns must be whole numbers >= 0, not {k!r}")
        if max_steps is not None and k >= max_steps:
            raise BranchError(f"branch_at={k} is beyond the episode length: the env ends episodes after "
                              f"max_steps={max_steps} actions, so the last state to branch at is {max_steps - 1}")
    if len(set(points)) != len(points):
        raise BranchError(f"branch_at lists a turn twice: {list(points)}")
    return sorted(points)


def default_success(t: Trajectory) -> bool:
    return t.reward > 0


def write_values(tree: EpisodeTree) -> None:
    """Put each branch point's value into the root trajectory (turn fields and metadata)."""
    tree.root.metadata["mc_values"] = {str(k): p.value for k, p in sorted(tree.points.items())}
    tree.root.metadata["mc_samples"] = {str(k): p.samples for k, p in sorted(tree.points.items())}
    for k, point in tree.points.items():
        if k < len(tree.root.turns):
            tree.root.turns[k].mc_value, tree.root.turns[k].mc_samples = point.value, point.samples


async def run_tree(make_env: Callable[[AsyncSandboxClient], SandboxEnv], policy: Policy, task_id: str | None, *,
                   branch_at: int | Sequence[int], branches: int, client: AsyncSandboxClient | None = None,
                   concurrency: int = 8, gate: asyncio.Semaphore | None = None, seed: int | None = None,
                   success: Callable[[Trajectory], bool] = default_success, record_messages: bool = False,
                   screenshots: ScreenshotSink | None = None, system_prompt: str = SYSTEM_PROMPT,
                   seq: int = 0) -> EpisodeTree:
    """One root episode of `task_id` with `branches` continuations forked at each turn of `branch_at`.
    `seq` numbers the tree within a run (`metadata["branch"]["seq"]`, for seeded policies)."""
    if concurrency < 1:
        raise BranchError("concurrency must be at least 1")
    own_client = client is None
    client = client or AsyncSandboxClient()
    gate = gate or asyncio.Semaphore(concurrency)
    env = make_env(client)
    try:
        ks = check_branching(branch_at, branches, env.max_steps)
        return await _grow(env, policy, task_id, ks, branches, gate, seq, seed=seed, success=success,
                           record_messages=record_messages, screenshots=screenshots, system_prompt=system_prompt)
    finally:
        await env.aclose()
        if own_client:
            await client.aclose()


async def _grow(env: SandboxEnv, policy: Policy, task_id: str | None, ks: list[int], branches: int,
                gate: asyncio.Semaphore, seq: int, *, seed, success, record_messages, screenshots, system_prompt) -> EpisodeTree:
    tree_id = uuid.uuid4().hex[:12]
    pending: dict[int, list[asyncio.Task]] = {}
    kwargs = {"record_messages": record_messages, "screenshots": screenshots}
    async with gate:
        try:
            obs, info = await env.areset(seed=seed, options={"task_id": task_id} if task_id else None)
        except Exception as e:  # a tree that cannot start is a failed root, not a crash of the batch
            root = Trajectory(env_id=env.env_id, task_id=task_id or "?", ended_at=time.time(),
                              error=f"reset failed: {type(e).__name__}: {e}")
            root.metadata["branch"] = {"tree": tree_id, "seq": seq, "at": None, "index": None}
            return EpisodeTree(tree_id=tree_id, task_id=root.task_id, root=root)
        root = env.trajectory
        root.metadata["branch"] = {"tree": tree_id, "seq": seq, "at": None, "index": None}
        root.metadata.setdefault("task", observation_text(obs)[:4000])
        messages = first_messages(obs, system_prompt)
        tools = info["tools"]
        tree = EpisodeTree(tree_id=tree_id, task_id=root.task_id, root=root)
        bound = policy.bind(env) if hasattr(policy, "bind") else policy  # once: the root is one episode
        for k in ks:
            snap = await snapshot_at(env, bound, messages, tools, k, **kwargs)
            if snap is None:
                tree.points[k] = BranchPoint(at=k, error=f"the root episode ended after {len(root.turns)} turns, "
                                                         f"before turn {k}")
                continue
            pending[k] = [asyncio.create_task(_gated(gate, run_branch(
                env, snap, policy, list(messages), tools, {"tree": tree_id, "seq": seq, "at": k, "index": i}, **kwargs)))
                for i in range(branches)]
            tree.points[k] = BranchPoint(at=k)
        await play(env, bound, messages, tools, bind=False, **kwargs)
        await env.release_sandbox()  # the root's sandbox; its snapshots live until the env closes
    for k, tasks in pending.items():
        point = tree.points[k]
        point.trajectories = list(await asyncio.gather(*tasks))
        counted = [t for t in point.trajectories if t.ok]
        point.samples, point.successes = len(counted), sum(bool(success(t)) for t in counted)
        point.value = point.successes / point.samples if point.samples else None
    write_values(tree)
    return tree


async def _gated(gate: asyncio.Semaphore, episode: Awaitable[Trajectory]) -> Trajectory:
    async with gate:
        return await episode


async def snapshot_at(env: SandboxEnv, policy: Policy, messages: list[dict], tools: list[dict], at: int,
                      **play_kwargs: Any) -> EnvSnapshot | None:
    """Play a reset env's episode (a bound policy, `messages` extended in place) on to turn `at` and
    snapshot its state there: the branch point. None when the episode ended or failed before it."""
    await play(env, policy, messages, tools, stop_at=at, bind=False, **play_kwargs)
    if env.done or len(env.trajectory.turns) < at or env.trajectory.error:
        return None
    return await env.asnapshot()


async def run_branch(parent: SandboxEnv, snap: EnvSnapshot, policy: Policy, messages: list[dict],
                     tools: list[dict], branch: dict, *, timeout: float | None = None,
                     **play_kwargs: Any) -> Trajectory:
    """One continuation from a branch point: an env like `parent` restored from `snap`, played to its
    end with its own copy of `messages` (`metadata["branch"] = branch`). A fork that fails, or one
    still running after `timeout` seconds, is one failed sample (`trajectory.error`), not a crash."""
    env = parent.clone()
    try:
        try:
            await env.areset(options={"snapshot": snap})
        except Exception as e:  # one failed fork is one failed sample
            t = snap.trajectory.model_copy(deep=True)
            t.error, t.ended_at = f"fork failed: {type(e).__name__}: {e}", time.time()
            t.metadata["branch"] = branch
            return t
        env.trajectory.metadata["branch"] = dict(branch)
        try:
            return await asyncio.wait_for(play(env, policy, list(messages), tools, **play_kwargs), timeout)
        except TimeoutError:
            env.trajectory.error = f"aborted: the wall-clock budget of {timeout:.0f}s ran out"
        except Exception as e:  # the continuation broke (not the policy: play records that)
            env.trajectory.error = f"fork failed: {type(e).__name__}: {e}"
        env.trajectory.ended_at = time.time()
        return env.trajectory
    finally:
        await env.aclose()


async def run_trees(make_env: Callable[[AsyncSandboxClient], SandboxEnv], policy: Policy, task_ids: Sequence[str],
                    *, branch_at: int | Sequence[int], branches: int, concurrency: int = 8,
                    client: AsyncSandboxClient | None = None, progress: bool = True, **kwargs: Any
                    ) -> list[EpisodeTree]:
    """`run_tree` for every task id (repeat ids for several trees), sharing one client and one
    concurrency bound. Results come back in the order of `task_ids`."""
    check_branching(branch_at, branches)
    if concurrency < 1:
        raise BranchError("concurrency must be at least 1")
    own_client = client is None
    client = client or AsyncSandboxClient()
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(task_ids), desc="trees", disable=not progress, unit="tree")

    async def one(seq: int, task_id: str) -> EpisodeTree:
        tree = await run_tree(make_env, policy, task_id, branch_at=branch_at, branches=branches, client=client,
                              gate=gate, seq=seq, **kwargs)
        bar.update(1)
        return tree

    try:
        return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(task_ids))))
    finally:
        bar.close()
        if own_client:
            await client.aclose()
