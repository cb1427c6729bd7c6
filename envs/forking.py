"""Env-level snapshots: fork a live episode, reset from a snapshot, restore a task's set-up.

The sandbox side (`sandbox.snapshot()`, `create_sandbox(from_snapshot=...)`) keeps the
filesystem only: running processes are gone in a restored sandbox, so the env's `resume`
hook rebuilds the tool context there (and restarts services, e.g. Claw's tool server or
the GUI display). On top of it:

- `EnvSnapshot`: a sandbox snapshot plus what the env needs to continue from it (task,
  trajectory so far, tool context, elapsed time). It is deleted from the backend when
  its last holder lets go: the env that took it (at `close`) and every env restored
  from it (at its next reset or close).
- `fork(env, n)`: n new envs of the same class continuing from the current state, each
  with its own copy of the trajectory so far and its own sandbox.
- `restore(env, snap)`: what `env.reset(options={"snapshot": snap})` does.
- set-up snapshots (`snapshot_setup=True` on the env): the first reset of a task snapshots
  the sandbox right after `setup`; later resets of that task restore it instead of
  running `setup` again.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
from typing import Any, ClassVar, Protocol

import gymnasium as gym

from orchard_gym.errors import OrchardError
from orchard_gym.trajectory import Trajectory

from .tools import Tool, ToolContext


class SandboxEnv(Protocol):
    """What forking reads and sets of an env: envs/base.py's `SandboxEnv` (which imports this
    module, so it is named here by what it has)."""

    env_id: ClassVar[str]
    forks_midway: ClassVar[bool]
    per_episode_attrs: ClassVar[tuple[str, ...]]
    snapshot_setup: bool
    sandbox: Any
    task: Any
    trajectory: Trajectory | None
    tools: dict[str, Tool]
    _client: Any
    _owns_client: bool
    _ctx: ToolContext | None
    _started: float
    _done: bool
    _last_obs: Any
    _np_random: Any

    @property
    def tool_schemas(self) -> list[dict]: ...
    def sandbox_size(self, task: Any) -> dict: ...
    def first_observation(self, task: Any) -> Any: ...
    def _info(self, **extra: Any) -> dict: ...
    async def _get_client(self) -> Any: ...
    async def _release_sandbox(self, background: bool = False) -> None: ...
    async def setup(self, sandbox: Any, task: Any) -> ToolContext: ...
    async def resume(self, sandbox: Any, task: Any, ctx: ToolContext) -> ToolContext: ...


class EnvSnapshot:
    """A sandbox snapshot of an episode's state and what continuing from it takes (in-process only:
    the tool context may hold live objects)."""

    def __init__(self, env: SandboxEnv, snapshot_id: str, ctx: ToolContext, trajectory: Trajectory | None):
        self.snapshot_id = snapshot_id
        self.env_id, self.env_class = env.env_id, type(env)
        self.task_id = trajectory.task_id if trajectory is not None else None
        self.task = env.task
        self.ctx = ctx
        self.trajectory = trajectory.model_copy(deep=True) if trajectory is not None else None
        self.elapsed = time.monotonic() - env._started
        self.size = env.sandbox_size(env.task)
        self._client = env._client
        self._holds = 1  # the env that took it
        self.deleted = False

    @property
    def turns(self) -> int:
        return len(self.trajectory.turns) if self.trajectory is not None else 0

    def hold(self) -> None:
        if self.deleted:
            raise gym.error.Error(f"snapshot {self.snapshot_id} was deleted")
        self._holds += 1

    async def release(self) -> None:
        """Let go of one hold; the last one deletes the snapshot (already gone: fine)."""
        self._holds -= 1
        if self._holds > 0 or self.deleted:
            return
        self.deleted = True
        try:
            await self._client.delete_snapshot(self.snapshot_id)
        except OrchardError:
            pass  # swept already, or the backend went away: nothing left to free

    def __repr__(self) -> str:
        return f"EnvSnapshot({self.snapshot_id!r}, task={self.task_id!r}, turns={self.turns})"


def _state(env: SandboxEnv) -> dict:
    """The per-env bookkeeping of snapshots, created on first use (no change to SandboxEnv.__init__)."""
    state = env.__dict__.get("_snapshots")
    if state is None:
        state = env.__dict__["_snapshots"] = {"owned": [], "using": None, "setup": {}}
    return state


async def take_snapshot(env: SandboxEnv) -> EnvSnapshot:
    """Snapshot the env's sandbox now (the episode's state after the turns so far)."""
    if env.sandbox is None or env._ctx is None:
        raise gym.error.Error("snapshot needs a live sandbox: call reset() first (the env is closed or not reset)")
    record = await env.sandbox.snapshot()
    snap = EnvSnapshot(env, record.snapshot_id, env._ctx, env.trajectory)
    _state(env)["owned"].append(snap)
    return snap


def check_snapshot(env: SandboxEnv, snap: Any) -> EnvSnapshot:
    if not isinstance(snap, EnvSnapshot):
        raise gym.error.Error(f"options['snapshot'] must be an EnvSnapshot (what env.snapshot() returns), not "
                              f"{type(snap).__name__} {snap!r:.80}")
    if snap.deleted:
        raise gym.error.Error(f"snapshot {snap.snapshot_id} was deleted (its envs were closed)")
    if snap.env_class is not type(env):
        raise gym.error.Error(f"snapshot {snap.snapshot_id} is of a {snap.env_class.__name__} ({snap.env_id}), "
                              f"not of this {type(env).__name__}")
    return snap


async def restore(env: SandboxEnv, snap: Any, seed: int | None = None) -> tuple[Any, dict]:
    """Reset `env` into the snapshot's state: a new sandbox from it, the trajectory so far, the budget used."""
    snap = check_snapshot(env, snap)
    gym.Env.reset(env, seed=seed)
    await env._release_sandbox()
    client = await env._get_client()
    snap.hold()
    _state(env)["using"] = snap
    env.task = snap.task
    env.trajectory = snap.trajectory.model_copy(deep=True)
    env.trajectory.metadata["restored_from"] = snap.snapshot_id
    env._started, env._done = time.monotonic() - snap.elapsed, False
    env.sandbox = await client.create_sandbox(from_snapshot=snap.snapshot_id, **snap.size)  # the snapshot's image
    env.trajectory.sandbox_id = env.sandbox.sandbox_id
    try:
        env._ctx = await env.resume(env.sandbox, env.task, snap.ctx)
    except BaseException:
        await env._release_sandbox()
        raise
    turns = env.trajectory.turns
    env._last_obs = turns[-1].observation if turns else env.first_observation(env.task)
    return env._last_obs, env._info(tools=env.tool_schemas, sandbox_id=env.sandbox.sandbox_id,
                                    snapshot_id=snap.snapshot_id)


def default_resume(sandbox, ctx: ToolContext) -> ToolContext:
    """The same tool context on the restored sandbox (for envs whose set-up only writes files). The
    working directory may differ between sandboxes (the local backend's is under each one's own
    folder): paths under the old one are moved to the new one."""
    old, new = ctx.sandbox.workdir, sandbox.workdir

    def move(value: str) -> str:
        return value.replace(old, new) if old and new and old != new else value

    return dataclasses.replace(ctx, sandbox=sandbox, cwd=move(ctx.cwd), env={k: move(v) for k, v in ctx.env.items()},
                               state=dict(ctx.state))


def clone(env: SandboxEnv) -> SandboxEnv:
    """A new env of the same class and settings with no episode, sharing the client."""
    child = copy.copy(env)
    child.__dict__.pop("_snapshots", None)
    child.__dict__.pop("_deleting", None)  # the parent's last sandbox, still being deleted: the parent's
    child.sandbox, child._ctx, child.trajectory, child.task = None, None, None, None
    if env._owns_client and env._client is not None:  # the client closes with the last env that shares it
        env._client.__dict__["_orchard_env_users"] = env._client.__dict__.get("_orchard_env_users", 1) + 1
    for name in env.per_episode_attrs:
        setattr(child, name, None)
    child._np_random = copy.deepcopy(env._np_random)
    child.tools = dict(env.tools)
    return child


async def fork(env: SandboxEnv, n: int) -> list[SandboxEnv]:
    """`n` envs continuing from `env`'s current state; `env` itself goes on untouched."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise gym.error.Error(f"fork needs a whole number of envs >= 1, not {n!r}")
    if env.sandbox is None or env._ctx is None or env.trajectory is None:
        raise gym.error.Error("fork needs a live episode: call reset() first (the env is closed or not reset)")
    if env._done:
        raise gym.error.Error("the episode is over: fork before it ends (or reset)")
    if env.trajectory.turns and not env.forks_midway:
        raise gym.error.Error(f"{type(env).__name__} keeps episode state in processes a snapshot does not keep: "
                              "it can fork right after reset only")
    snap = await take_snapshot(env)
    children = [clone(env) for _ in range(n)]
    try:
        await asyncio.gather(*(restore(c, snap) for c in children))
    except BaseException:
        await asyncio.gather(*(c.aclose() for c in children), return_exceptions=True)
        raise
    finally:
        _state(env)["owned"].remove(snap)
        await snap.release()  # the children hold it now
    return children


def last_user(client) -> bool:
    """Whether the env closing now is the last one on a client it made (forks share their parent's)."""
    users = client.__dict__.get("_orchard_env_users", 1) - 1
    client.__dict__["_orchard_env_users"] = users
    return users <= 0


# ------------------------------------------------------------------ set-up snapshots (reset as restore)
def setup_snapshot_kwargs(env: SandboxEnv, task_id: str) -> dict:
    """`create_sandbox` kwargs: restore the task's set-up snapshot when the env keeps one. The snapshot
    is taken out of the cache until the restore worked: one that fails (swept, say) is not tried again,
    the next reset sets the task up afresh."""
    state = _state(env)
    failed = state.pop("pending", None)
    if failed is not None:  # the last restore did not get as far as `setup_or_resume`
        state["owned"].append(failed)
    snap = state["setup"].pop(task_id, None) if env.snapshot_setup else None
    if snap is None:
        return {}
    state["pending"] = snap
    return {"from_snapshot": snap.snapshot_id}


async def setup_or_resume(env: SandboxEnv, task_id: str) -> ToolContext:
    """The tool context of a fresh episode: `resume` on a restored set-up, else `setup` (and snapshot it)."""
    state = _state(env)
    setups = state["setup"]
    restored = state.pop("pending", None)
    if restored is not None:
        setups[task_id] = restored
        env.trajectory.metadata["restored_setup"] = restored.snapshot_id
        return await env.resume(env.sandbox, env.task, restored.ctx)
    ctx = await env.setup(env.sandbox, env.task)
    if env.snapshot_setup:
        env._ctx = ctx
        record = await env.sandbox.snapshot()
        setups[task_id] = EnvSnapshot(env, record.snapshot_id, ctx, None)
    return ctx


async def release_all(env: SandboxEnv, *, closing: bool) -> None:
    """Let go of the snapshot the episode was restored from; on close, of every snapshot the env took."""
    state = env.__dict__.get("_snapshots")
    if state is None:
        return
    using, state["using"] = state["using"], None
    if using is not None:
        await using.release()
    if closing:
        owned = state["owned"] + list(state["setup"].values()) + [s for s in [state.pop("pending", None)] if s]
        state["owned"], state["setup"] = [], {}
        for snap in owned:
            await snap.release()
