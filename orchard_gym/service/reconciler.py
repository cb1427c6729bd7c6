"""The reconciliation loop: make the store agree with the backend and clean up after
clients and replicas that died.

Every `reconcile_interval` each replica renews its liveness key; the one holding the
reconciler lease then

- deletes sandboxes whose heartbeat is older than `sandbox_ttl` (the client died),
- marks failed those whose backend resource vanished or whose agent died,
- takes over the ready-wait of sandboxes whose creating replica died,
- adopts sandboxes the backend runs that no record covers (an orchestrator's only: they
  carry an owner label),
- fails the jobs of replicas that died mid-command (their outcome is unknown).
"""

from __future__ import annotations

import asyncio
import logging
import time

from orchard_gym.errors import SandboxNotFound

from .auth import OWNER_LABEL
from .sandboxes import LIVE, ServiceControl
from .settings import ServiceSettings
from .store import Store

log = logging.getLogger("orchard_gym.service.reconciler")


class Reconciler:
    def __init__(self, settings: ServiceSettings, backend, store: Store, control: ServiceControl, metrics=None):
        self.settings, self.backend, self.store = settings, backend, store
        self.control, self.metrics = control, metrics
        self.replica = settings.replica_id
        self._task: asyncio.Task | None = None
        self.passes = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())
        on_lost = getattr(self.backend, "on_lost", None)
        if on_lost is not None:  # a backend that watches (kubernetes) says at once when a sandbox is lost
            on_lost(self._lost)

    async def _lost(self, sandbox_id: str, reason: str) -> None:
        try:
            await self.control.mark_failed(sandbox_id, reason)
        except Exception:
            log.exception("could not mark a lost sandbox failed", extra={"sandbox_id": sandbox_id})

    async def _loop(self) -> None:
        while True:
            try:
                await self.reconcile_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reconciliation pass failed")
            await asyncio.sleep(self.settings.reconcile_interval)

    async def reconcile_once(self) -> dict[str, int]:
        """One pass; returns what it did (for logs and tests)."""
        ttl = self.settings.replica_dead_after
        await self.store.beat_replica(self.replica, ttl)
        done = {"reaped": 0, "failed": 0, "adopted": 0, "resumed": 0, "jobs_failed": 0}
        if not await self.store.lead(self.replica, ttl):
            return done
        started = time.monotonic()
        now = time.time()
        for sandbox_id in await self.store.expired(now - self.settings.sandbox_ttl):
            try:
                await self.control.delete(sandbox_id, reason="heartbeat expired")
                done["reaped"] += 1
            except SandboxNotFound:
                pass
            except Exception:
                log.exception("could not reap sandbox", extra={"sandbox_id": sandbox_id})

        seen = {r.sandbox_id: r for r in await self.backend.list()}  # before the store: see sandboxes.py
        alive_cache: dict[str, bool] = {}

        async def replica_alive(replica: str | None) -> bool:
            if not replica:
                return False
            if replica == self.replica:
                return True
            if replica not in alive_cache:
                alive_cache[replica] = await self.store.replica_alive(replica)
            return alive_cache[replica]

        for record in await self.store.list_sandboxes():
            current = seen.pop(record.sandbox_id, None)
            if record.status not in LIVE:
                continue
            created_by_backend = record.details.get("backend_created")
            if current is None:
                if not (created_by_backend or not await replica_alive(record.details.get("replica"))
                        or now > record.details.get("ready_deadline", 0)):
                    continue
                # the list may lag behind the backend (a watch cache not yet told of another
                # replica's create, or refilling after a 410): ask for this one before failing it
                current = await self.backend.get(record.sandbox_id)
                if current is None:
                    if await self.control.mark_failed(record.sandbox_id, "its backend resource vanished"):
                        done["failed"] += 1
                    continue
            if current.status == "failed":
                if await self.control.mark_failed(record.sandbox_id, current.error or "its agent died"):
                    done["failed"] += 1
            elif record.status == "pending" and not await replica_alive(record.details.get("replica")):
                left = max(1.0, record.details.get("ready_deadline", now) - now)
                self.control.watch(current, left)
                done["resumed"] += 1

        for sandbox_id, current in seen.items():
            if OWNER_LABEL not in current.labels:
                continue  # not an orchestrator's (an in-process client's, in the same place): never adopted
            if await self.backend.get(sandbox_id) is not None and await self.control.adopt(current):
                done["adopted"] += 1

        for job_id, owner in (await self.store.active_jobs()).items():
            if owner != self.replica and not await replica_alive(owner):
                await self.control.jobs.fail_orphaned(job_id, owner)
                done["jobs_failed"] += 1

        from .snapshots import expire_snapshots
        done["snapshots_expired"] = await expire_snapshots(self.backend, self.settings.snapshot_ttl)

        reap = getattr(self.backend, "reap", None)
        if reap is not None:
            reap()
        self.passes += 1
        if self.metrics is not None:
            self.metrics.reconcile_seconds.observe(time.monotonic() - started)
            for what, count in done.items():
                if count:
                    self.metrics.reconciled.labels(what).inc(count)
        if any(done.values()):
            log.info("reconciled", extra=done)
        return done

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
