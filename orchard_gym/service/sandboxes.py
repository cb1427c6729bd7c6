"""The orchestrator's control plane: the SDK's in-process one (`orchard_gym/control.py`,
which calls the agents and notices when a sandbox died) with its records in the shared
store — lifecycle (create, ready, delete), heartbeats, failures — and the jobs of
`execs.py` on its exec path. The routes (`api.py`) are a thin HTTP layer over it.

A record is written to the store *before* the backend creates anything and removed only
*after* the backend deleted it, so a backend sandbox without a record is a true orphan
(the reconciler adopts it) and nothing the backend runs goes unaccounted for.
"""

from __future__ import annotations

import asyncio
import logging
import time

from orchard_gym.backends.base import new_sandbox_id
from orchard_gym.control import InProcessControl, check_services_supported
from orchard_gym.errors import SandboxFailed, SandboxNotFound, SandboxTimeout
from orchard_gym.models import ExecRequest, JobResult, PatchResult, SandboxRecord, SandboxSpec, SnapshotRecord
from orchard_gym.retry import RetryPolicy

from .auth import ANONYMOUS, OWNER_LABEL
from .errors import Conflict
from .execs import ExecManager
from .settings import ServiceSettings
from .store import Store

log = logging.getLogger("orchard_gym.service.sandboxes")
LIVE = ("pending", "running")


def sandbox_key(sandbox_id: str) -> str:
    return f"sb:{sandbox_id}"


class ServiceControl(InProcessControl):
    """`InProcessControl` with its records in the store, shared by replicas."""

    def __init__(self, settings: ServiceSettings, backend, store: Store, metrics=None):
        # connection refusals are retried for a while (an agent still starting, a restart);
        # a connection that broke after the request was sent is not (exec is not idempotent)
        super().__init__(backend, RetryPolicy(attempts=10_000, initial=0.02, maximum=0.5,
                                              deadline=max(settings.agent_retry_window, 0.001)))
        self.settings, self.store, self.metrics = settings, store, metrics
        self.replica = settings.replica_id
        self._watchers: dict[str, asyncio.Task] = {}
        self.pools = None  # pools.ServicePools, when the replica keeps warm pools
        self.jobs = ExecManager(settings, store, self, metrics)  # its exec path; they call back into it

    # ------------------------------------------------------------------ lifecycle
    async def create(self, spec: SandboxSpec, wait_ready: bool = False, timeout: float = 0.0, *,
                     owner: str = ANONYMOUS) -> SandboxRecord:
        """`owner`: the owner label (auth.py) the record and the backend's labels carry.
        wait_ready: answer once it is ready or failed, or still pending after `timeout`."""
        check_services_supported(self.backend, spec)
        record = await self._create(spec, owner)
        if wait_ready:
            try:
                record = await self.wait_ready(record.sandbox_id, timeout)
            except SandboxTimeout:
                record = await self.get(record.sandbox_id)  # still pending: the caller waits on
        return record

    async def _create(self, spec: SandboxSpec, owner: str) -> SandboxRecord:
        if self.pools is not None:  # a warm sandbox of this spec, now `owner`'s (pools.py)
            claimed = await self.pools.claim(spec, owner, self.settings.ready_timeout)
            if claimed is not None:
                self.agents.remember(claimed[0].sandbox_id, claimed[1])
                return claimed[0]
        sandbox_id = spec.sandbox_id or new_sandbox_id()
        spec = spec.model_copy(update={"sandbox_id": sandbox_id, "labels": {**spec.labels, OWNER_LABEL: owner}})
        timeout = spec.timeout or self.settings.ready_timeout
        now = time.time()
        record = SandboxRecord(
            sandbox_id=sandbox_id, image=spec.image, status="pending", backend=self.backend.name,
            block_network=spec.block_network, cpu=spec.cpu, memory=spec.memory, env=spec.env, labels=spec.labels,
            created_at=now, last_heartbeat=now,
            details={"replica": self.replica, "ready_deadline": now + timeout, "ready_timeout": timeout},
        )
        if not await self.store.add_sandbox(record):
            raise Conflict(f"sandbox {sandbox_id} already exists")
        started = time.monotonic()
        try:
            created = await self.backend.create(spec)
        except BaseException:
            await self.store.remove_sandbox(sandbox_id)
            raise
        deleted_meanwhile = False

        def merge(r: SandboxRecord):
            nonlocal deleted_meanwhile
            if r.status in ("deleting", "deleted"):
                deleted_meanwhile = True
                return False
            r.image, r.workdir = created.image, created.workdir
            r.details = {**created.details, **r.details, "backend_created": True}

        merged = await self.store.update_sandbox(sandbox_id, merge)
        if merged is None or deleted_meanwhile:
            # a delete came while the backend was creating: it found nothing to delete, so the
            # sandbox that exists now is ours to remove (or it would live on until nobody reaps it)
            await self._remove_late(sandbox_id)
            raise SandboxNotFound(f"sandbox {sandbox_id} was deleted while it was being created")
        self.agents.remember(sandbox_id, created.endpoint)
        self.watch(created, timeout, started)
        return merged

    async def _remove_late(self, sandbox_id: str) -> None:
        try:
            await self.backend.delete(sandbox_id)
        except Exception as e:
            log.warning("could not delete a sandbox deleted during its creation",
                        extra={"sandbox_id": sandbox_id, "error": str(e)})
        log.info("sandbox deleted", extra={"sandbox_id": sandbox_id, "reason": "deleted while being created"})

    def watch(self, backend_record: SandboxRecord, timeout: float, started: float | None = None) -> None:
        """Wait for the agent in the background; set the status and wake the waiters."""
        sandbox_id = backend_record.sandbox_id
        if sandbox_id in self._watchers:
            return
        task = asyncio.get_running_loop().create_task(self._wait_ready(backend_record, timeout, started))
        self._watchers[sandbox_id] = task
        task.add_done_callback(lambda _: self._watchers.pop(sandbox_id, None))

    async def _wait_ready(self, backend_record: SandboxRecord, timeout: float, started: float | None) -> None:
        sandbox_id = backend_record.sandbox_id
        try:
            await self.backend.wait_ready(backend_record, timeout)
            status, error = "running", None
        except asyncio.CancelledError:
            raise
        except Exception as e:
            status, error = "failed", f"{type(e).__name__}: {e}"

        def settle(r: SandboxRecord):
            if r.status != "pending":
                return False
            r.status, r.error = status, error

        await self.store.update_sandbox(sandbox_id, settle)
        await self.store.notify(sandbox_key(sandbox_id))
        if self.metrics is not None and started is not None:
            self.metrics.observe_ready(status, time.monotonic() - started)
        if status == "failed":
            log.warning("sandbox failed to start", extra={"sandbox_id": sandbox_id, "error": error})
            await self._free(sandbox_id)  # keep the record (it says why); free what it held

    async def _free(self, sandbox_id: str) -> None:
        try:
            await self.destroy(sandbox_id)
        except Exception as e:
            log.warning("could not free a failed sandbox", extra={"sandbox_id": sandbox_id, "error": str(e)})

    async def get(self, sandbox_id: str) -> SandboxRecord:
        record = await self.store.get_sandbox(sandbox_id)
        if record is None:
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
        return record

    async def list(self) -> list[SandboxRecord]:
        return await self.store.list_sandboxes()

    async def wait_ready(self, sandbox_id: str, timeout: float) -> SandboxRecord:
        """Block until the sandbox is running or failed, woken by its event."""
        deadline = time.monotonic() + timeout
        async with self.store.waiter(sandbox_key(sandbox_id)) as waiter:
            while True:
                record = await self.get(sandbox_id)
                if record.status not in ("pending",):
                    if record.status in ("deleting", "deleted"):
                        raise SandboxNotFound(f"sandbox {sandbox_id} is being deleted")
                    return record
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxTimeout(f"sandbox {sandbox_id} not ready after {timeout:g}s")
                await waiter.wait(left)

    async def heartbeat(self, sandbox_id: str) -> SandboxRecord:  # type: ignore[override]
        return await self.use(sandbox_id)

    async def use(self, sandbox_id: str) -> SandboxRecord:
        """Any use of a sandbox counts as a heartbeat. Raises unless it can take commands."""
        record = await self.store.touch(sandbox_id)
        if record is None or record.status in ("deleting", "deleted"):
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
        if record.status == "failed":
            raise SandboxFailed(f"sandbox {sandbox_id} has failed: {record.error}")
        return record

    async def delete(self, sandbox_id: str, reason: str = "requested") -> None:
        def mark(r: SandboxRecord):
            r.status = "deleting"

        if await self.store.update_sandbox(sandbox_id, mark) is None:
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
        watcher = self._watchers.pop(sandbox_id, None)
        if watcher is not None:
            watcher.cancel()
        await self.destroy(sandbox_id)
        await self.store.remove_sandbox(sandbox_id)
        await self.store.notify(sandbox_key(sandbox_id))
        log.info("sandbox deleted", extra={"sandbox_id": sandbox_id, "reason": reason})

    async def mark_failed(self, sandbox_id: str, error: str) -> bool:
        changed = False

        def fail(r: SandboxRecord):
            nonlocal changed
            if r.status not in LIVE:
                return False
            r.status, r.error, changed = "failed", error, True

        await self.store.update_sandbox(sandbox_id, fail)
        if changed:
            await self.agents.forget(sandbox_id)
            await self.store.notify(sandbox_key(sandbox_id))
            log.warning("sandbox failed", extra={"sandbox_id": sandbox_id, "error": error})
        return changed

    async def adopt(self, backend_record: SandboxRecord) -> bool:
        """Take over a sandbox the backend runs but no record covers (a replica restarted
        with an in-memory store, a record lost): it lives on, with a fresh heartbeat. Only an
        orchestrator's own sandboxes (they carry an owner label) are adopted: one that an
        in-process client made in the same place is not ours to serve or reap."""
        if OWNER_LABEL not in backend_record.labels:
            return False
        now = time.time()
        record = backend_record.model_copy(update={
            "last_heartbeat": now, "endpoint": None,
            "details": {**backend_record.details, "replica": self.replica, "adopted_at": now,
                        "backend_created": True},
        })
        if record.status not in ("running", "failed"):
            record.status = "running"
        if not await self.store.add_sandbox(record):
            return False
        log.info("sandbox adopted", extra={"sandbox_id": record.sandbox_id, "status": record.status})
        return True

    async def resources(self, sandbox_id: str) -> dict:
        await self.get(sandbox_id)  # 404 for unknown ids, as every sandbox route
        return await super().resources(sandbox_id)

    async def snapshot(self, sandbox_id: str, labels: dict[str, str] | None = None) -> SnapshotRecord:
        record = await self.use(sandbox_id)  # 404 when gone, 409 when failed; counts as a heartbeat
        # the owner comes from the record, not the backend: a sandbox claimed from a warm pool was
        # made (and labelled) before it had one
        owner = {OWNER_LABEL: record.labels[OWNER_LABEL]} if OWNER_LABEL in record.labels else {}
        return await super().snapshot(sandbox_id, {**(labels or {}), **owner} or None)

    # ------------------------------------------------------------------ commands: through the jobs
    async def exec(self, sandbox_id: str, req: ExecRequest) -> JobResult:
        return await self.jobs.submit(sandbox_id, req, True, req.timeout + 5.0)

    async def apply_patch(self, sandbox_id: str, patch: str, timeout: float, cwd: str | None) -> PatchResult:
        return await self.jobs.apply_patch(sandbox_id, patch, timeout, cwd)

    async def cancel(self, sandbox_id: str, job_id: str) -> bool:
        return await self.jobs.cancel(job_id)

    # ------------------------------------------------------------------ agent calls (the hooks)
    async def _agent_for(self, sandbox_id: str):
        return await self.agents.get(sandbox_id) or await self._agent_when_ready(sandbox_id)

    async def _agent_when_ready(self, sandbox_id: str):
        """No agent address yet: a pending sandbox (kubernetes: a pod not yet scheduled) is waited
        for until its ready deadline; anything else is gone."""
        record = await self.store.get_sandbox(sandbox_id)
        current = await self.backend.get(sandbox_id) if record is not None and record.status == "pending" else None
        if current is not None and current.status == "pending":
            left = max(1.0, record.details.get("ready_deadline", time.time()) - time.time())
            await self.wait_ready(sandbox_id, left)
            agent = await self.agents.get(sandbox_id)
            if agent is not None:
                return agent
        await self._gone(sandbox_id, None)

    async def _gone(self, sandbox_id: str, current: SandboxRecord | None, cause: Exception | None = None):
        await self.agents.forget(sandbox_id)
        record = await self.store.get_sandbox(sandbox_id)
        if record is None or record.status in ("deleting", "deleted"):
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}") from cause
        reason = (current.error if current else None) or "its backend resource no longer exists"
        await self.mark_failed(sandbox_id, reason)
        raise SandboxFailed(f"sandbox {sandbox_id} is dead: {reason}") from cause

    async def aclose(self) -> None:
        """Its watchers, jobs and agent clients; not the backend (app.py closes it: sandboxes
        live on, and a restarted replica adopts them)."""
        await self.jobs.aclose()
        for task in list(self._watchers.values()):
            task.cancel()
        await asyncio.gather(*self._watchers.values(), return_exceptions=True)
        await self.agents.aclose()
