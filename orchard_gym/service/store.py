"""Where the orchestrator keeps shared state: sandbox records, heartbeats, jobs, locks and
wake-up events. `MemoryStore` serves one replica; `RedisStore` (`redis_store.py`) lets
several replicas share one pool of sandboxes.

Waiting is event-driven everywhere: a waiter registers for a key *before* it checks the
state, and whoever changes that state calls `notify(key)`, so no wake-up is lost and
nobody polls.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from pydantic import Field

from orchard_gym.errors import ServiceUnavailable
from orchard_gym.models import JobResult, SandboxRecord

# An update function mutates the record in place; returning False means "leave it as it was".
Updater = Callable[[SandboxRecord], bool | None]


class StoreUnavailable(ServiceUnavailable):
    """The shared store cannot be used (unreachable, or it refused our credentials)."""


class Job(JobResult):
    """A job as the store keeps it: with the owner label of the key that ran it (see auth.py),
    which the API never shows."""

    key_owner: str | None = Field(None, description="sha256 of the API key that ran it")

    def public_json(self) -> str:
        return self.model_dump_json(exclude={"key_owner"})

    def public(self) -> JobResult:
        return JobResult.model_validate(self.model_dump(exclude={"key_owner"}))


class Waiter:
    """One registration for wake-ups on a key."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        """True if woken, False when `timeout` passed first. Re-arms itself."""
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await self._event.wait()
        except TimeoutError:
            return False
        self._event.clear()
        return True


class LocalWaiters:
    """Waiters of this process by key; the base of both stores' events."""

    def __init__(self) -> None:
        self._by_key: dict[str, set[Waiter]] = {}

    @asynccontextmanager
    async def register(self, key: str) -> AsyncIterator[Waiter]:
        waiter = Waiter()
        self._by_key.setdefault(key, set()).add(waiter)
        try:
            yield waiter
        finally:
            waiters = self._by_key.get(key)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._by_key[key]

    def wake(self, key: str) -> None:
        for waiter in self._by_key.get(key, ()):
            waiter.set()

    def wake_all(self) -> None:
        for waiters in self._by_key.values():
            for waiter in waiters:
                waiter.set()


class Store(ABC):
    """The state replicas share. Records never hold an agent token (`endpoint` is not stored)."""

    kind = "store"

    def __init__(self) -> None:
        self.waiters = LocalWaiters()

    # ----------------------------------------------------------------- sandboxes
    @abstractmethod
    async def add_sandbox(self, record: SandboxRecord) -> bool:
        """Insert a new record; False if the id is taken."""

    @abstractmethod
    async def get_sandbox(self, sandbox_id: str) -> SandboxRecord | None: ...

    @abstractmethod
    async def list_sandboxes(self) -> list[SandboxRecord]: ...

    @abstractmethod
    async def update_sandbox(self, sandbox_id: str, fn: Updater) -> SandboxRecord | None:
        """Atomically read, change (`fn` mutates it) and write a record; None if missing."""

    @abstractmethod
    async def remove_sandbox(self, sandbox_id: str) -> bool: ...

    @abstractmethod
    async def touch(self, sandbox_id: str, now: float | None = None) -> SandboxRecord | None:
        """Refresh the sandbox's liveness timer and return its record (None if unknown)."""

    @abstractmethod
    async def expired(self, before: float) -> list[str]:
        """Ids of sandboxes whose last heartbeat is older than `before`."""

    # ----------------------------------------------------------------- jobs
    @abstractmethod
    async def put_job(self, job: Job, owner: str | None, ttl: float) -> None:
        """Write a job; `owner` is the replica running it (None once it has finished)."""

    @abstractmethod
    async def get_job(self, job_id: str) -> Job | None: ...

    @abstractmethod
    async def active_jobs(self) -> dict[str, str]:
        """Unfinished jobs: job id -> the replica running it."""

    @abstractmethod
    async def forget_active_job(self, job_id: str) -> None:
        """Drop a job from the unfinished ones (its record expired)."""

    # ----------------------------------------------------------------- events
    def waiter(self, key: str):
        """`async with store.waiter(key) as w: <check state>; await w.wait(t)`."""
        return self.waiters.register(key)

    async def notify(self, key: str) -> None:
        self.waiters.wake(key)

    # ----------------------------------------------------------------- locks, replicas
    @abstractmethod
    def lock(self, name: str, ttl: float):
        """An async context manager holding a lock shared by every replica. A replica that
        dies holding it loses it after `ttl` seconds."""

    @abstractmethod
    async def beat_replica(self, replica_id: str, ttl: float) -> None: ...

    @abstractmethod
    async def replica_alive(self, replica_id: str) -> bool: ...

    @abstractmethod
    async def lead(self, replica_id: str, ttl: float) -> bool:
        """Take or keep the reconciler lease; True while this replica holds it."""

    async def start(self) -> None:
        pass

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        pass


class MemoryStore(Store):
    """State in this process: one replica. Restarting it loses records, and the control
    plane re-adopts what the backend still runs.

    Records go in and out as shallow copies, not deep ones: every change (an `Updater`
    included) assigns a field anew and never mutates a stored dict in place, so a copy of
    the fields is all that keeps a caller's record apart from the stored one."""

    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self._sandboxes: dict[str, SandboxRecord] = {}
        self._beats: dict[str, float] = {}
        self._jobs: dict[str, tuple[Job, float]] = {}
        self._active: dict[str, str] = {}
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._last_prune = time.monotonic()

    async def add_sandbox(self, record: SandboxRecord) -> bool:
        if record.sandbox_id in self._sandboxes:
            return False
        self._sandboxes[record.sandbox_id] = record.model_copy()
        self._beats[record.sandbox_id] = record.last_heartbeat
        return True

    def _out(self, sandbox_id: str) -> SandboxRecord | None:
        record = self._sandboxes.get(sandbox_id)
        if record is None:
            return None
        out = record.model_copy()
        out.last_heartbeat = self._beats.get(sandbox_id, out.last_heartbeat)
        return out

    async def get_sandbox(self, sandbox_id: str) -> SandboxRecord | None:
        return self._out(sandbox_id)

    async def list_sandboxes(self) -> list[SandboxRecord]:
        return [r for r in map(self._out, list(self._sandboxes)) if r is not None]

    async def update_sandbox(self, sandbox_id: str, fn: Updater) -> SandboxRecord | None:
        record = self._out(sandbox_id)
        if record is None:
            return None
        if fn(record) is not False:
            self._sandboxes[sandbox_id] = record.model_copy()
        return record

    async def remove_sandbox(self, sandbox_id: str) -> bool:
        self._beats.pop(sandbox_id, None)
        return self._sandboxes.pop(sandbox_id, None) is not None

    async def touch(self, sandbox_id: str, now: float | None = None) -> SandboxRecord | None:
        if sandbox_id not in self._sandboxes:
            return None
        self._beats[sandbox_id] = now or time.time()
        return self._out(sandbox_id)

    async def expired(self, before: float) -> list[str]:
        return [sid for sid, beat in self._beats.items() if beat < before]

    async def put_job(self, job: Job, owner: str | None, ttl: float) -> None:
        self._jobs[job.job_id] = (job.model_copy(), time.monotonic() + ttl)
        if owner is None:
            self._active.pop(job.job_id, None)
        else:
            self._active[job.job_id] = owner
        self._prune()

    def _prune(self) -> None:
        now = time.monotonic()
        if now - self._last_prune < 10:
            return
        self._last_prune = now
        for job_id in [j for j, (_, until) in self._jobs.items() if until < now and j not in self._active]:
            del self._jobs[job_id]

    async def get_job(self, job_id: str) -> Job | None:
        entry = self._jobs.get(job_id)
        if entry is None or (entry[1] < time.monotonic() and job_id not in self._active):
            return None
        return entry[0].model_copy()

    async def active_jobs(self) -> dict[str, str]:
        return dict(self._active)

    async def forget_active_job(self, job_id: str) -> None:
        self._active.pop(job_id, None)

    @asynccontextmanager
    async def lock(self, name: str, ttl: float):
        lock, users = self._locks.get(name, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[name] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[name]
            if users <= 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)

    async def beat_replica(self, replica_id: str, ttl: float) -> None:
        pass

    async def replica_alive(self, replica_id: str) -> bool:
        return True  # one replica: if this code runs, it is alive

    async def lead(self, replica_id: str, ttl: float) -> bool:
        return True
