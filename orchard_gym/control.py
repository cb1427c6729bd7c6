"""Where the SDK's calls go: the in-process control (a backend in this process) or a
remote orchestrator (`orchard_gym.remote`). Both speak this one interface."""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator

from .agent_client import AgentClient
from .agent_pool import AgentPool
from .errors import AgentUnavailable, InvalidRequest, SandboxFailed, SandboxNotFound, SnapshotNotFound
from .models import (ExecEvent, ExecRequest, FileInfo, JobResult, PatchResult, SandboxRecord, SandboxSpec,
                     SnapshotRecord, check_snapshot_id)
from .retry import RetryPolicy


class SandboxControl(ABC):
    """The operations a SandboxInstance needs, by sandbox id."""

    @abstractmethod
    async def create(self, spec: SandboxSpec, wait_ready: bool, timeout: float) -> SandboxRecord: ...

    @abstractmethod
    async def get(self, sandbox_id: str) -> SandboxRecord: ...

    @abstractmethod
    async def list(self) -> list[SandboxRecord]: ...

    @abstractmethod
    async def wait_ready(self, sandbox_id: str, timeout: float) -> SandboxRecord: ...

    @abstractmethod
    async def delete(self, sandbox_id: str) -> None: ...

    @abstractmethod
    async def heartbeat(self, sandbox_id: str) -> None: ...

    @abstractmethod
    async def exec(self, sandbox_id: str, req: ExecRequest) -> JobResult: ...

    @abstractmethod
    def exec_stream(self, sandbox_id: str, req: ExecRequest) -> AsyncIterator[ExecEvent]: ...

    @abstractmethod
    async def upload(self, sandbox_id: str, path: str, data: bytes, mode: int | None) -> dict: ...

    @abstractmethod
    async def download(self, sandbox_id: str, path: str) -> bytes: ...

    @abstractmethod
    async def list_files(self, sandbox_id: str, path: str) -> list[FileInfo]: ...

    @abstractmethod
    async def apply_patch(self, sandbox_id: str, patch: str, timeout: float, cwd: str | None) -> PatchResult: ...

    async def resources(self, sandbox_id: str) -> dict:
        raise NotImplementedError

    async def cancel(self, sandbox_id: str, job_id: str) -> bool:
        """Kill a running job; False when no job of that id runs."""
        raise NotImplementedError

    async def snapshot(self, sandbox_id: str) -> SnapshotRecord:
        raise InvalidRequest("this control cannot snapshot")

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """SnapshotNotFound when there is none of that id."""
        raise InvalidRequest("this control cannot snapshot")

    async def list_snapshots(self) -> list[SnapshotRecord]:
        raise InvalidRequest("this control cannot snapshot")

    loads_snapshots = False  # whether a pooled sandbox can be given a snapshot's files (load_snapshot)

    async def load_snapshot(self, sandbox_id: str, snapshot_id: str) -> SandboxRecord:
        raise InvalidRequest("this control cannot load a snapshot into a running sandbox")

    @abstractmethod
    async def open_pty(self, sandbox_id: str, init: dict):
        """A terminal session for the init frame (terminal.init_frame): a terminal.PtyChannel."""

    async def aclose(self) -> None:
        pass


TIMED_OUT_EXIT = 124


def job_from_result(sandbox_id: str, req: ExecRequest, result, started: float) -> JobResult:
    now = time.time()
    exit_code, stderr = result.exit_code, result.stderr
    if result.timed_out:  # as timeout(1) and Orchard Env: 124, and a line saying so
        exit_code = TIMED_OUT_EXIT
        sep = "\n" if stderr and not stderr.endswith("\n") else ""
        stderr += f"{sep}Command timed out after {req.timeout:g}s and was killed\n"
    limit = getattr(result, "limit", None)
    if limit:  # where the caller (a policy) reads: on stderr too
        sep = "\n" if stderr and not stderr.endswith("\n") else ""
        stderr += f"{sep}orchard: {limit}\n"
    return JobResult(
        job_id=req.job_id or uuid.uuid4().hex,
        sandbox_id=sandbox_id,
        command=req.command,
        status="succeeded" if exit_code == 0 else "failed",
        stdout=result.stdout,
        stderr=stderr,
        exit_code=exit_code,
        created_at=started,
        started_at=started,
        completed_at=now,
        error=f"timed out after {req.timeout:g}s" if result.timed_out else ("cancelled" if getattr(result, "cancelled", False)
                                                                           else limit or None),
        duration=result.duration,
        timed_out=result.timed_out,
        truncated=result.truncated,
    )


class InProcessControl(SandboxControl):
    """The control plane: drives a backend in this process; exec goes straight to the agent.

    The SDK uses it as it is. The orchestrator (`service/sandboxes.py`) is this same object
    behind HTTP: it subclasses it to keep the records in its shared store instead of
    `_records` (the hooks `_agent_for`, `_gone` and `use`), and adds jobs, tenancy and
    metrics around it; the agent calls, the death checks, the results and the snapshots are
    these."""

    def __init__(self, backend, retry: RetryPolicy | None = None):
        self.backend = backend
        self.retry = retry or RetryPolicy()
        self.agents = AgentPool(backend, self.retry)
        self._records: dict[str, SandboxRecord] = {}

    # ------------------------------------------------------------------ records (hooks)
    async def _record(self, sandbox_id: str) -> SandboxRecord:
        record = self._records.get(sandbox_id)
        if record is None:
            record = await self.backend.get(sandbox_id)  # created by another process: adopt it
            if record is None:
                raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
            self._records[sandbox_id] = record
        return record

    async def _agent_for(self, sandbox_id: str) -> AgentClient:
        """The agent of a sandbox no client is cached for yet."""
        record = await self._record(sandbox_id)
        if record.status == "failed":
            raise SandboxFailed(f"sandbox {sandbox_id} has failed: {record.error}")
        if record.endpoint is None:  # no address yet (a pod not yet scheduled): wait for it
            record = await self.backend.wait_ready(record, self.retry.deadline + 90)
        self.agents.remember(sandbox_id, record.endpoint)
        agent = self.agents.cached(sandbox_id)
        if agent is None:
            raise SandboxFailed(f"sandbox {sandbox_id} has no agent address")
        return agent

    async def _gone(self, sandbox_id: str, current: SandboxRecord | None, cause: Exception) -> None:
        """The agent cannot be reached and the backend says the sandbox is dead (or gone): raise."""
        self._records.pop(sandbox_id, None)
        await self.agents.forget(sandbox_id)
        reason = current.error if current else "it no longer exists"
        raise SandboxFailed(f"sandbox {sandbox_id} is dead: {reason}") from cause

    async def use(self, sandbox_id: str) -> SandboxRecord | None:
        """Before a file or terminal call: the orchestrator counts it as a heartbeat and refuses
        a sandbox that cannot take commands; in-process the agent call itself says so."""
        return None

    # ------------------------------------------------------------------ lifecycle
    async def create(self, spec: SandboxSpec, wait_ready: bool, timeout: float) -> SandboxRecord:
        check_services_supported(self.backend, spec)
        record = await self.backend.create(spec)
        self._records[record.sandbox_id] = record
        if wait_ready:
            try:
                record = await self.backend.wait_ready(record, spec.timeout or timeout)
            except BaseException:
                await self.delete(record.sandbox_id)
                raise
        return record

    async def get(self, sandbox_id: str) -> SandboxRecord:
        current = await self.backend.get(sandbox_id)
        if current is None:
            self._records.pop(sandbox_id, None)
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
        return current

    async def list(self) -> list[SandboxRecord]:
        return await self.backend.list()

    async def wait_ready(self, sandbox_id: str, timeout: float) -> SandboxRecord:
        return await self.backend.wait_ready(await self._record(sandbox_id), timeout)

    async def delete(self, sandbox_id: str) -> None:
        self._records.pop(sandbox_id, None)
        if not await self.destroy(sandbox_id):
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")

    async def destroy(self, sandbox_id: str) -> bool:
        """Drop its agent client and delete it on the backend; False if the backend had none."""
        await self.agents.forget(sandbox_id)
        return await self.backend.delete(sandbox_id)

    async def heartbeat(self, sandbox_id: str) -> None:
        record = await self._record(sandbox_id)
        record.last_heartbeat = time.time()

    async def resources(self, sandbox_id: str) -> dict:
        found = await self.backend.sandbox_resources(sandbox_id)
        if found is None:
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
        return found

    # ------------------------------------------------------------------ snapshots
    async def snapshot(self, sandbox_id: str, labels: dict[str, str] | None = None) -> SnapshotRecord:
        return await self.backend.snapshot(sandbox_id, labels)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        try:
            check_snapshot_id(snapshot_id)
        except ValueError as e:
            raise SnapshotNotFound(str(e)) from None
        if not await self.backend.delete_snapshot(snapshot_id):
            raise SnapshotNotFound(f"no snapshot {snapshot_id[:80]!r}")

    async def list_snapshots(self) -> list[SnapshotRecord]:
        return await self.backend.list_snapshots()

    @property
    def loads_snapshots(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.backend, "loads_snapshots", False))

    async def load_snapshot(self, sandbox_id: str, snapshot_id: str) -> SandboxRecord:
        try:
            check_snapshot_id(snapshot_id)
        except ValueError as e:
            raise InvalidRequest(str(e)) from None
        return await self.backend.load_snapshot(sandbox_id, snapshot_id)

    # ------------------------------------------------------------------ agent calls
    async def call(self, sandbox_id: str, method: str, *args):
        """Call the sandbox's agent; when it cannot be reached, say whether the sandbox died."""
        agent = self.agents.cached(sandbox_id) or await self._agent_for(sandbox_id)
        try:
            return await getattr(agent, method)(*args)
        except AgentUnavailable as e:
            await self._raise_if_dead(sandbox_id, e)
            raise

    async def _raise_if_dead(self, sandbox_id: str, cause: Exception) -> None:
        current = await self.backend.get(sandbox_id)
        if current is None or current.status == "failed":
            await self._gone(sandbox_id, current, cause)

    async def run(self, sandbox_id: str, req: ExecRequest) -> JobResult:
        """Run a command on the agent and wait for it: its job result."""
        started = time.time()
        return job_from_result(sandbox_id, req, await self.call(sandbox_id, "exec", req), started)

    async def exec(self, sandbox_id: str, req: ExecRequest) -> JobResult:
        return await self.run(sandbox_id, req)

    async def exec_stream(self, sandbox_id: str, req: ExecRequest) -> AsyncIterator[ExecEvent]:
        agent = self.agents.cached(sandbox_id) or await self._agent_for(sandbox_id)
        try:
            async for event in agent.exec_stream(req):
                yield event
        except AgentUnavailable as e:
            await self._raise_if_dead(sandbox_id, e)
            raise

    async def cancel(self, sandbox_id: str, job_id: str) -> bool:
        return await self.call(sandbox_id, "cancel", job_id)

    async def upload(self, sandbox_id: str, path: str, data: bytes, mode: int | None) -> dict:
        await self.use(sandbox_id)
        return await self.call(sandbox_id, "upload", path, data, mode)

    async def download(self, sandbox_id: str, path: str) -> bytes:
        await self.use(sandbox_id)
        return await self.call(sandbox_id, "download", path)

    async def download_stream(self, sandbox_id: str, path: str) -> tuple[int, AsyncIterator[bytes]]:
        """The file's size and its bytes as they arrive (the agent's refusals raise here, first)."""
        await self.use(sandbox_id)
        return await self.call(sandbox_id, "download_stream", path)

    async def list_files(self, sandbox_id: str, path: str) -> list[FileInfo]:
        await self.use(sandbox_id)
        return await self.call(sandbox_id, "list_files", path)

    async def apply_patch(self, sandbox_id: str, patch: str, timeout: float, cwd: str | None) -> PatchResult:
        return await self.call(sandbox_id, "apply_patch", patch, cwd, timeout)

    async def open_pty(self, sandbox_id: str, init: dict):
        await self.use(sandbox_id)
        return await self.call(sandbox_id, "open_pty", init)

    async def aclose(self) -> None:
        await self.agents.aclose()
        await self.backend.aclose()


def check_services_supported(backend, spec: SandboxSpec) -> None:
    """InvalidRequest when `spec` asks for services (sidecars) that `backend` cannot run
    (`Backend.supports_services`: the docker backend only)."""
    if spec.services and not getattr(backend, "supports_services", False):
        raise InvalidRequest(f"the {getattr(backend, 'name', 'given')} backend cannot run services (sidecar "
                             f"containers: {', '.join(s.name for s in spec.services)}); only the docker backend does")
