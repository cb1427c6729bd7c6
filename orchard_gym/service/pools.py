"""The orchestrator's warm pools (`orchard serve --pool IMAGE=N`, `ORCHARD_POOLS`).

An idle pooled sandbox has no store record: no key sees it, lists it or reaps it, and the
reconciler never adopts it (it carries no owner label, only `orchard-gym.pool=<replica>`).
A claim turns it into a record owned by the claiming key (`OWNER_LABEL` in the record,
which is what every route checks), so a sandbox claimed by key A is A's alone; from then
on it is deleted, reaped and failed like any other sandbox.

Pools are per replica. On start, a replica (pools or not) deletes the pooled sandboxes of replicas that
are gone and that no record claims (an idle pool a dead replica left behind, or a claim whose
in-memory record died with it); `orchard sandbox gc` does the same for local sandboxes.
"""

from __future__ import annotations

import logging
import time

from orchard_gym.backends import procs
from orchard_gym.backends.base import OWNER_LABEL
from orchard_gym.models import AgentEndpoint, SandboxRecord, SandboxSpec
from orchard_gym.pool import PoolSet, PoolSpec

from .store import Store

log = logging.getLogger("orchard_gym.service.pools")
POOL_LABEL = "orchard-gym.pool"


class BackendProvider:
    """Creates pooled sandboxes on the backend directly (no record until claimed)."""

    def __init__(self, backend):
        self.backend = backend

    async def create(self, spec: SandboxSpec) -> SandboxRecord:
        record = await self.backend.create(spec)
        try:
            return await self.backend.wait_ready(record, spec.timeout)
        except BaseException:
            await self.backend.delete(record.sandbox_id)
            raise

    async def alive(self, record: SandboxRecord) -> bool:
        return await self.backend.is_alive(record.sandbox_id)

    async def delete(self, sandbox_id: str) -> None:
        await self.backend.delete(sandbox_id)


async def sweep_left_behind(backend, store: Store, replica: str | None) -> list[str]:
    """Delete the pooled sandboxes of replicas that are gone that no record claims: idle ones,
    and claimed ones whose record went with an in-memory state (unreachable by anyone, and no
    owner label on them to adopt them by). Run by a replica's start (pools or not) and by
    `orchard sandbox gc` (`replica=None`: no replica of its own, and only sandboxes whose
    backend names the process that made them)."""
    deleted = []
    for record in await backend.list():
        pool_of = record.labels.get(POOL_LABEL)
        if not pool_of or pool_of == replica or OWNER_LABEL in record.labels:
            continue
        creator = record.details.get("creator")  # the local backend's: the replica's process
        if creator is not None:
            gone = not procs.alive(creator)
        elif replica is None:
            continue  # gc cannot tell a running replica's pool from a dead one's
        else:  # an in-memory state is one replica's: any other replica's pool is a previous run's
            gone = store.kind == "memory" or not await store.replica_alive(pool_of)
        if gone and await store.get_sandbox(record.sandbox_id) is None:
            await backend.delete(record.sandbox_id)
            deleted.append(record.sandbox_id)
            log.info("sandbox deleted", extra={"sandbox_id": record.sandbox_id,
                                               "reason": "in the pool of a replica that is gone, claimed by no record"})
    return deleted


class ServicePools:
    def __init__(self, specs: list[PoolSpec], backend, store: Store, replica: str):
        self.backend, self.store, self.replica = backend, store, replica
        self.pools = PoolSet(specs, BackendProvider(backend), labels={POOL_LABEL: replica})

    async def start(self) -> None:
        if self.pools:
            self.pools.start()

    async def claim(self, spec: SandboxSpec, owner: str, ready_timeout: float) \
            -> tuple[SandboxRecord, AgentEndpoint] | None:
        """A ready sandbox of `spec` as a new record owned by `owner` (stored), and its agent's
        endpoint (never stored); None: create as usual."""
        backend_record = await self.pools.claim(spec)
        if backend_record is None:
            return None
        now = time.time()
        record = SandboxRecord(
            sandbox_id=backend_record.sandbox_id, image=backend_record.image, status="running",
            backend=self.backend.name, block_network=spec.block_network, cpu=spec.cpu, memory=spec.memory,
            env=spec.env, labels={OWNER_LABEL: owner}, workdir=backend_record.workdir, created_at=now,
            last_heartbeat=now,
            details={**backend_record.details, "replica": self.replica, "ready_deadline": now,
                     "ready_timeout": spec.timeout or ready_timeout, "backend_created": True, "pooled": True},
        )
        if not await self.store.add_sandbox(record):  # cannot happen (fresh ids), but never hand out twice
            await self.backend.delete(record.sandbox_id)
            return None
        return record, backend_record.endpoint

    def stats(self) -> list[dict]:
        return self.pools.stats()

    async def aclose(self) -> None:
        await self.pools.aclose()
