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
- `env.arestore(snap)` (envs/base.py): what `env.reset(options={"snapshot": snap})` does;
  `env.clone()`: a new env of the same settings, sharing the client. The env keeps its own
  episode state; what it holds of snapshots is `env.snapshots` (a `SnapshotBook`).
- set-up snapshots (`snapshot_setup=True` on the env): the first reset of a task snapshots
  the sandbox right after `setup`; later resets of that task restore it instead of
  running `setup` again.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, ClassVar, Protocol

import gymnasium as gym

from orchard_gym.errors import OrchardError
from orchard_gym.trajectory import Trajectory

from .tools import ToolContext


class SandboxEnv(Protocol):
    """What forking reads and calls of an env: envs/base.py's `SandboxEnv` (which imports this
    module, so it is named here by what it has). Only its public contract: the env keeps its
    own state, forking never reads or sets an `_`-prefixed attribute of it."""

    env_id: ClassVar[str]
    forks_midway: ClassVar[bool]
    snapshot_setup: bool
    sandbox: Any
    task: Any
    trajectory: Trajectory | None
    ctx: ToolContext | None
    snapshots: SnapshotBook

    @property
    def done(self) -> bool: ...
    @property
    def elapsed(self) -> float: ...
    @property
    def client(self) -> Any: ...
    def sandbox_size(self, task: Any) -> dict: ...
    def clone(self) -> Any: ...
    async def release_sandbox(self, background: bool = False) -> None: ...
    async def arestore(self, snap: Any, seed: int | None = None) -> tuple[Any, dict]: ...
    async def aclose(self) -> None: ...
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
        self.elapsed = env.elapsed
        self.size = env.sandbox_size(env.task)
        self._client = env.client
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


class SnapshotBook:
    """The snapshots one env holds (`env.snapshots`): those it took (`owned`), the one its
    episode was restored from (`using`), its tasks' set-up snapshots (`setup`, by task id) and a
    set-up restore under way (`pending`)."""

    def __init__(self) -> None:
        self.owned: list[EnvSnapshot] = []
        self.using: EnvSnapshot | None = None
        self.setup: dict[str, EnvSnapshot] = {}
        self.pending: EnvSnapshot | None = None

    def use(self, snap: EnvSnapshot) -> None:
        """The episode now runs on a sandbox restored from `snap`: hold it until the next reset or close."""
        snap.hold()
        self.using = snap

    def holds_any(self) -> bool:
        return bool(self.owned or self.using or self.setup or self.pending)


async def take_snapshot(env: SandboxEnv) -> EnvSnapshot:
    """Snapshot the env's sandbox now (the episode's state after the turns so far)."""
    if env.sandbox is None or env.ctx is None:
        raise gym.error.Error("snapshot needs a live sandbox: call reset() first (the env is closed or not reset)")
    record = await env.sandbox.snapshot()
    snap = EnvSnapshot(env, record.snapshot_id, env.ctx, env.trajectory)
    env.snapshots.owned.append(snap)
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


def default_resume(sandbox, ctx: ToolContext) -> ToolContext:
    """The same tool context on the restored sandbox (for envs whose set-up only writes files). The
    working directory may differ between sandboxes (the local backend's is under each one's own
    folder): paths under the old one are moved to the new one."""
    old, new = ctx.sandbox.workdir, sandbox.workdir

    def move(value: str) -> str:
        return value.replace(old, new) if old and new and old != new else value

    return dataclasses.replace(ctx, sandbox=sandbox, cwd=move(ctx.cwd), env={k: move(v) for k, v in ctx.env.items()},
                               state=dict(ctx.state))


async def fork(env: SandboxEnv, n: int) -> list[SandboxEnv]:
    """`n` envs continuing from `env`'s current state; `env` itself goes on untouched."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise gym.error.Error(f"fork needs a whole number of envs >= 1, not {n!r}")
    if env.sandbox is None or env.ctx is None or env.trajectory is None:
        raise gym.error.Error("fork needs a live episode: call reset() first (the env is closed or not reset)")
    if env.done:
        raise gym.error.Error("the episode is over: fork before it ends (or reset)")
    if env.trajectory.turns and not env.forks_midway:
        raise gym.error.Error(f"{type(env).__name__} keeps episode state in processes a snapshot does not keep: "
                              "it can fork right after reset only")
    snap = await take_snapshot(env)
    children = [env.clone() for _ in range(n)]
    try:
        await asyncio.gather(*(c.arestore(snap) for c in children))
    except BaseException:
        await asyncio.gather(*(c.aclose() for c in children), return_exceptions=True)
        raise
    finally:
        env.snapshots.owned.remove(snap)
        await snap.release()  # the children hold it now
    return children


def add_user(client) -> None:
    """One more env closes `client` (a fork shares the client its parent made)."""
    client.__dict__["_orchard_env_users"] = client.__dict__.get("_orchard_env_users", 1) + 1


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
    book = env.snapshots
    failed, book.pending = book.pending, None
    if failed is not None:  # the last restore did not get as far as `setup_or_resume`
        book.owned.append(failed)
    snap = book.setup.pop(task_id, None) if env.snapshot_setup else None
    if snap is None:
        return {}
    book.pending = snap
    return {"from_snapshot": snap.snapshot_id}


def kept_setup(env: SandboxEnv, task_id: str) -> EnvSnapshot | None:
    """The set-up snapshot the env keeps for `task_id` (None without `snapshot_setup`, or before the
    task's first set-up): the task's state before any action, for a sandbox that must start there
    (SWE grading: a fork of it instead of a new sandbox set up again)."""
    snap = env.snapshots.setup.get(task_id) if env.snapshot_setup else None
    return snap if snap is not None and not snap.deleted else None


async def setup_or_resume(env: SandboxEnv, task_id: str) -> ToolContext:
    """The tool context of a fresh episode: `resume` on a restored set-up, else `setup` (and snapshot it)."""
    book = env.snapshots
    setups = book.setup
    restored, book.pending = book.pending, None
    if restored is not None:
        setups[task_id] = restored
        env.trajectory.metadata["restored_setup"] = restored.snapshot_id
        return await env.resume(env.sandbox, env.task, restored.ctx)
    ctx = await env.setup(env.sandbox, env.task)
    if env.snapshot_setup:
        env.ctx = ctx
        record = await env.sandbox.snapshot()
        setups[task_id] = EnvSnapshot(env, record.snapshot_id, ctx, None)
    return ctx


async def release_all(env: SandboxEnv, *, closing: bool) -> None:
    """Let go of the snapshot the episode was restored from; on close, of every snapshot the env took."""
    book = env.snapshots
    using, book.using = book.using, None
    if using is not None:
        await using.release()
    if closing:
        owned = book.owned + list(book.setup.values()) + [s for s in [book.pending] if s]
        book.owned, book.setup, book.pending = [], {}, None
        for snap in owned:
            await snap.release()
