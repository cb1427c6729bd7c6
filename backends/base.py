"""The backend interface: create, reach, delete, list. Everything else lives above it."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
import uuid
from abc import ABC, abstractmethod

from orchard_gym.agent_client import AgentClient
from orchard_gym.errors import InvalidRequest, SandboxFailed, SandboxTimeout
from orchard_gym.models import SandboxRecord, SandboxSpec, SnapshotRecord

OWNER_LABEL = "orchard-gym.owner"
SANDBOX_LABEL = "orchard-gym.sandbox"


def new_sandbox_id() -> str:
    return "sb-" + uuid.uuid4().hex[:16]


def new_snapshot_id() -> str:
    return "snap-" + uuid.uuid4().hex[:16]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_sha256(token: str) -> str:
    """What the agent is given instead of its token (`--token-sha256`): nothing in the
    sandbox can then reveal the token, and a digest does not authenticate."""
    return hashlib.sha256(token.encode()).hexdigest()


class Backend(ABC):
    """Starts sandboxes with the agent in them and says how to reach the agent.

    Backends only decide how the agent is started and reached; exec, files and health
    are the same agent calls everywhere (see `orchard_gym.agent_client`).
    """

    name: str = "backend"
    supports_services: bool = False  # SandboxSpec.services (sidecar containers): the docker backend only

    @abstractmethod
    async def create(self, spec: SandboxSpec) -> SandboxRecord:
        """Start a sandbox and return its record with `endpoint` set (status pending)."""

    @abstractmethod
    async def delete(self, sandbox_id: str) -> bool:
        """Kill every process of the sandbox and free its resources; False if unknown."""

    @abstractmethod
    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        """The backend's view of one sandbox (with endpoint), or None."""

    @abstractmethod
    async def list(self) -> list[SandboxRecord]:
        """Every sandbox this backend's owner label covers."""

    async def is_alive(self, sandbox_id: str) -> bool:
        record = await self.get(sandbox_id)
        return record is not None and record.status in ("pending", "running")

    # Snapshots (docs/snapshots.md): the filesystem state of a sandbox, not its processes.
    # `create(SandboxSpec(from_snapshot=...))` starts a sandbox from one.
    async def snapshot(self, sandbox_id: str, labels: dict[str, str] | None = None) -> SnapshotRecord:
        """Freeze the sandbox's filesystem state (SandboxNotFound / SandboxFailed when it is gone).
        The snapshot carries the sandbox's labels, updated by `labels` (the orchestrator's owner:
        a sandbox claimed from a warm pool got its owner after the backend made it)."""
        raise InvalidRequest(f"{self.name} backend cannot snapshot")

    loads_snapshots = False  # whether load_snapshot works (a warm pool then serves forks)

    async def load_snapshot(self, sandbox_id: str, snapshot_id: str) -> SandboxRecord:
        """Give an untouched running sandbox (a pooled one) a snapshot's files, as if it had been
        created from it; its updated record."""
        raise InvalidRequest(f"{self.name} backend cannot load a snapshot into a running sandbox")

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        """Free a snapshot; False if unknown. Sandboxes started from it are not touched."""
        raise InvalidRequest(f"{self.name} backend cannot snapshot")

    async def list_snapshots(self) -> list[SnapshotRecord]:
        """Every snapshot this backend's owner covers."""
        raise InvalidRequest(f"{self.name} backend cannot snapshot")

    async def get_snapshot(self, snapshot_id: str) -> SnapshotRecord | None:
        return next((s for s in await self.list_snapshots() if s.snapshot_id == snapshot_id), None)

    async def sweep(self) -> list[str]:
        """Remove what dead owners left behind; returns the ids removed."""
        return []

    def resources(self) -> dict:
        return {"backend": self.name}

    def disk_limit_unavailable(self) -> str | None:
        """Why this backend cannot hold `SandboxSpec.disk` (None: it can). A create that asks
        for a disk limit here fails with this reason; an env that would rather run without the
        limit asks first (Harbor's `storage_mb`)."""
        return f"the {self.name} backend cannot limit a sandbox's disk space"

    async def sandbox_resources(self, sandbox_id: str) -> dict | None:
        """One sandbox's limits, kill method and usage; None if unknown. Backends with
        accounting (local: cgroups) override this."""
        if await self.get(sandbox_id) is None:
            return None
        return {"sandbox_id": sandbox_id, "backend": self.name, "kill": "the engine's (container or pod)",
                "usage": None}

    async def aclose(self) -> None:
        """Release clients and connections (sandboxes are not deleted)."""

    async def wait_ready(self, record: SandboxRecord, timeout: float) -> SandboxRecord:
        """Wait until the agent answers /health. Backends with a watch override this."""
        assert record.endpoint is not None
        client = AgentClient(record.endpoint)
        deadline = time.monotonic() + timeout
        delay = 0.002
        try:
            while True:
                try:
                    await client.health(timeout=max(0.1, min(2.0, deadline - time.monotonic())))
                    record.status = "running"
                    return record
                except Exception as e:  # not up yet: connection refused, no socket, ...
                    last = e
                if time.monotonic() >= deadline:
                    raise SandboxTimeout(
                        f"sandbox {record.sandbox_id} not ready after {timeout:.0f}s ({type(last).__name__}: {last})"
                    )
                if not await self.is_alive(record.sandbox_id):
                    current = await self.get(record.sandbox_id)
                    reason = (current and current.error) or "its process exited"
                    raise SandboxFailed(f"sandbox {record.sandbox_id} failed to start: {reason}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.1)
        finally:
            await client.aclose()

