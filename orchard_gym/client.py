"""The sandbox SDK, drop-in compatible with Orchard Env's Python SDK.

    from orchard_gym import SandboxClient

    with SandboxClient() as client:                 # local backend by default
        sandbox = client.create_sandbox()
        print(sandbox.exec("echo hello").stdout)    # hello

`AsyncSandboxClient` is the real implementation; `SandboxClient` runs it on a
background event loop. Either takes a backend config (in-process) or `base_url` +
`api_key` of an orchestrator; with neither (and no `ORCHARD_BASE_URL`), the local
backend.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import threading
import warnings
import weakref
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from ._loop import LoopThread
from .control import InProcessControl, SandboxControl
from .errors import InvalidRequest, SandboxNotFound, SnapshotNotFound
from .models import ExecEvent, ExecRequest, FileInfo, JobResult, PatchResult, SandboxRecord, SandboxSpec, SnapshotRecord
from .pool import ControlProvider, PoolSet, parse_pools
from .retry import RetryPolicy
from .terminal import AsyncPtyProcess, PtyProcess, init_frame

# an interactive shell in any image: bash where there is one, else sh
SHELL = ["sh", "-c", "command -v bash >/dev/null 2>&1 && exec bash -i || exec sh -i"]

DEFAULT_READY_TIMEOUT = 120.0
_live_clients: weakref.WeakSet[AsyncSandboxClient] = weakref.WeakSet()


class AsyncSandboxInstance:
    """One sandbox: run commands, move files, apply patches."""

    def __init__(self, client: AsyncSandboxClient, record: SandboxRecord):
        self._client = client
        self.record = record
        self._heartbeat: asyncio.Task | None = None
        self.usage = None  # orchard_gym.ledger.SandboxUsage, read by delete()

    @property
    def sandbox_id(self) -> str:
        return self.record.sandbox_id

    @property
    def id(self) -> str:
        return self.record.sandbox_id

    @property
    def status(self) -> str:
        return self.record.status

    @property
    def workdir(self) -> str | None:
        """The default working directory of commands (local backend: the sandbox folder)."""
        return self.record.workdir

    @property
    def _control(self) -> SandboxControl:
        return self._client._control

    def __repr__(self) -> str:
        return f"<AsyncSandboxInstance {self.sandbox_id} {self.status}>"

    async def exec(self, command: str | list[str], timeout: float = 600, cwd: str | None = None,
                   env: dict[str, str] | None = None, stdin: str | None = None,
                   login_shell: bool = False, job_id: str | None = None, *, pty: bool = False,
                   rows: int = 24, cols: int = 80) -> JobResult | AsyncPtyProcess:
        """Run a shell string (or an argv list) and wait for it. Never raises on a
        non-zero exit: check `result.exit_code` / `result.succeeded`. Give a `job_id` to
        be able to `cancel(job_id)` it from elsewhere while it runs.

        pty=True: start it on a terminal of rows x cols instead and return at once an
        AsyncPtyProcess to drive it (send, read, read_until, resize, kill, wait, close);
        `timeout`, `stdin` and `job_id` do not apply (the process runs until it exits or
        is closed)."""
        if pty:
            if stdin is not None or job_id is not None:
                raise InvalidRequest("stdin and job_id do not apply to pty=True: send() input to the process")
            init = init_frame(command, env=env, cwd=cwd, rows=rows, cols=cols, login_shell=login_shell)
            return await AsyncPtyProcess.start(await self._control.open_pty(self.sandbox_id, init))
        req = _exec_request(command, timeout, cwd, env, stdin, login_shell, job_id)
        return await self._control.exec(self.sandbox_id, req)

    async def shell(self, program: str | list[str] | None = None, *, rows: int = 24, cols: int = 80,
                    cwd: str | None = None, env: dict[str, str] | None = None) -> AsyncPtyProcess:
        """An interactive shell on a terminal (bash -i where there is bash, else sh -i; or
        `program`, e.g. "python3"): exec(program, pty=True)."""
        command = SHELL if program is None else ([program] if isinstance(program, str) else program)
        return await self.exec(command, cwd=cwd, env=env, pty=True, rows=rows, cols=cols)

    async def exec_stream(self, command: str | list[str], timeout: float = 600, cwd: str | None = None,
                          env: dict[str, str] | None = None, stdin: str | None = None,
                          login_shell: bool = False, job_id: str | None = None) -> AsyncIterator[ExecEvent]:
        """Run a command and yield its output as it comes; the last event has type 'exit'.
        Stopping the iteration early (break, cancellation) kills the command."""
        req = _exec_request(command, timeout, cwd, env, stdin, login_shell, job_id)
        async for event in self._control.exec_stream(self.sandbox_id, req):
            yield event

    async def cancel(self, job_id: str) -> bool:
        """Kill the running job `job_id` (as given to exec/exec_stream); its exec then
        returns with `error == "cancelled"` (stream: an exit event with cancelled=True).
        False when no such job runs (finished already, or never started)."""
        _validated(ExecRequest, command="x", job_id=job_id)  # the same id rules as exec
        return await self._control.cancel(self.sandbox_id, job_id)

    async def apply_patch(self, patch: str, timeout: float = 120, cwd: str | None = None) -> PatchResult:
        if not isinstance(patch, str):
            raise InvalidRequest("patch must be a string")
        return await self._control.apply_patch(self.sandbox_id, patch, timeout, cwd)

    async def upload_content(self, content: str | bytes, remote_path: str, mode: int | None = None) -> dict:
        data = content.encode() if isinstance(content, str) else content
        if not isinstance(data, (bytes, bytearray)):
            raise InvalidRequest("content must be str or bytes")
        return await self._control.upload(self.sandbox_id, remote_path, bytes(data), mode)

    async def upload_file(self, local_path: str | os.PathLike, remote_path: str, mode: int | None = None) -> dict:
        local = Path(local_path)
        data = await asyncio.to_thread(local.read_bytes)
        return await self.upload_content(data, remote_path, mode if mode is not None else local.stat().st_mode & 0o7777)

    async def download_content(self, remote_path: str) -> bytes:
        return await self._control.download(self.sandbox_id, remote_path)

    async def download_file(self, remote_path: str, local_path: str | os.PathLike) -> Path:
        data = await self.download_content(remote_path)
        local = Path(local_path)
        await asyncio.to_thread(local.write_bytes, data)
        return local

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        return await self._control.list_files(self.sandbox_id, path)

    async def refresh(self) -> SandboxRecord:
        self.record = await self._control.get(self.sandbox_id)
        return self.record

    async def wait_ready(self, timeout: float = DEFAULT_READY_TIMEOUT) -> SandboxRecord:
        self.record = await self._control.wait_ready(self.sandbox_id, timeout)
        return self.record

    async def heartbeat(self) -> None:
        await self._control.heartbeat(self.sandbox_id)

    async def resources(self) -> dict:
        """Limits, kill method and usage so far (local backend: cgroup CPU seconds, peak memory)."""
        return await self._control.resources(self.sandbox_id)

    async def snapshot(self) -> SnapshotRecord:
        """The sandbox's filesystem state now (not its running processes): start sandboxes
        from it with `create_sandbox(from_snapshot=record.snapshot_id)` (docs/snapshots.md).
        Deleted with the client that took it, or by `delete_snapshot`."""
        record = await self._control.snapshot(self.sandbox_id)
        self._client._snapshots.add(record.snapshot_id)
        return record

    def start_heartbeat(self, interval: float = 30.0) -> None:
        """Keep the sandbox alive on an orchestrator that reaps idle ones."""
        if interval <= 0:
            raise InvalidRequest("interval must be positive")
        self.stop_heartbeat()

        async def beat():
            while True:
                try:
                    await self.heartbeat()
                except SandboxNotFound:
                    return
                except Exception:
                    pass  # transient; the next beat retries
                await asyncio.sleep(interval)

        self._heartbeat = asyncio.get_running_loop().create_task(beat())

    def stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None

    async def delete(self) -> None:
        """Delete the sandbox; its usage so far (CPU, peak memory, wall time) is read first into
        `self.usage` (see orchard_gym.ledger; off with `client.account_usage = False`)."""
        self.stop_heartbeat()
        await self.collect_usage()
        await self._client.delete_sandbox(self.sandbox_id)
        self.record.status = "deleted"

    async def collect_usage(self) -> None:
        """Read the sandbox's usage so far into `self.usage` (once), as delete() does first."""
        if self._client.account_usage and self.usage is None and self.record.status != "deleted":
            from .ledger import collect

            self.usage = await collect(self)

    async def __aenter__(self) -> AsyncSandboxInstance:
        return self

    async def __aexit__(self, *exc) -> None:
        try:
            await self.delete()
        except SandboxNotFound:
            pass


class AsyncSandboxClient:
    """Creates and finds sandboxes on a backend in this process, or on an orchestrator."""

    account_usage = True  # AsyncSandboxInstance.delete() reads the sandbox's usage first (orchard_gym.ledger)

    def __init__(self, backend=None, *, base_url: str | None = None, api_key: str | None = None,
                 retry: RetryPolicy | None = None, cleanup_at_exit: bool = True, pool=None):
        """`pool`: warm pools, e.g. {"localhost/orchard/bookworm": 8} (see orchard_gym.pool)."""
        if backend is not None and base_url is not None:
            raise InvalidRequest("give either a backend or base_url, not both")
        if backend is None and base_url is None:
            base_url = os.environ.get("ORCHARD_BASE_URL") or None
            api_key = api_key or os.environ.get("ORCHARD_API_KEY")
        self._backend_spec, self._base_url, self._api_key = backend, base_url, api_key
        self.retry = retry or RetryPolicy()
        specs = parse_pools(pool)  # bad pool specs fail here, before anything starts
        self._control = self._make_control()
        self._pools = PoolSet(specs, ControlProvider(self._control))
        if specs and _loop_running():
            self._pools.start()  # else at the first create_sandbox/wait_pools
        self._owned: dict[str, AsyncSandboxInstance] = {}
        self._snapshots: set[str] = set()  # taken through this client: deleted when it closes
        self._closed = False
        if cleanup_at_exit:
            _live_clients.add(self)
            _install_exit_cleanup()

    def _make_control(self) -> SandboxControl:
        if self._base_url:
            from .remote import RemoteControl

            return RemoteControl(self._base_url, self._api_key, self.retry)
        from orchard_gym.backends.base import Backend
        from orchard_gym.backends.config import LocalBackendConfig, parse_backend_config

        spec = self._backend_spec
        if isinstance(spec, Backend):
            return InProcessControl(spec, self.retry)
        config = parse_backend_config(spec) if spec is not None else LocalBackendConfig()
        return InProcessControl(config.get_backend(), self.retry)

    @property
    def backend(self):
        """The in-process backend object (None in remote mode)."""
        return getattr(self._control, "backend", None)

    @property
    def backend_name(self) -> str | None:
        """"local", "docker", "kubernetes" (the in-process backend), None on an orchestrator."""
        return getattr(self.backend, "name", None)

    async def create_sandbox(self, image: str | None = None, block_network: bool = True,
                             sandbox_id: str | None = None, cpu: float | None = None,
                             memory: int | str | None = None, timeout: float = DEFAULT_READY_TIMEOUT,
                             wait_ready: bool = True, env: dict[str, str] | None = None,
                             labels: dict[str, str] | None = None,
                             from_snapshot: str | None = None, services: list | None = None,
                             disk: int | str | None = None) -> AsyncSandboxInstance:
        """Start a sandbox from `image` (local backend: None or 'host') and, by default,
        wait until its agent answers. `from_snapshot`: a snapshot id (`sandbox.snapshot()`)
        whose files the new sandbox starts with; `image` is then the snapshot's (docker: the
        snapshot image) unless given. `services`: sidecar containers (`ServiceSpec`s or their
        dicts; docker backend only), reachable from the sandbox by name, removed with it.
        `disk`: its writable disk space (`SandboxSpec.disk`; `backend.disk_limit_unavailable()`
        says beforehand why a backend cannot hold it)."""
        spec = _validated(SandboxSpec, image=image, block_network=block_network, sandbox_id=sandbox_id,
                          cpu=cpu, memory=memory, timeout=timeout, env=env or {}, labels=labels or {},
                          from_snapshot=from_snapshot, services=services or [], disk=disk)
        record = await self._pools.claim(spec) if self._pools else None
        if record is None and spec.from_snapshot is not None and self._pools and self._control.loads_snapshots:
            record = await self._fork_from_pool(spec)
        if record is None:  # no pool of this spec, or none ready
            record = await self._control.create(spec, wait_ready, timeout)
        instance = AsyncSandboxInstance(self, record)
        self._owned[record.sandbox_id] = instance
        return instance

    async def _fork_from_pool(self, spec: SandboxSpec) -> SandboxRecord | None:
        """A warm sandbox of the spec's pool given the snapshot's files (the local backend's
        layers: docs/snapshots.md); None when none is ready."""
        record = await self._pools.claim(spec.model_copy(update={"from_snapshot": None}))
        if record is None:
            return None
        try:
            return await self._control.load_snapshot(record.sandbox_id, spec.from_snapshot)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._control.delete(record.sandbox_id)
            raise

    async def wait_pools(self, timeout: float = DEFAULT_READY_TIMEOUT) -> bool:
        """Start the warm pools and wait until each is full; False on timeout."""
        return await self._pools.wait_full(timeout)

    def pool_stats(self) -> list[dict]:
        """Per pool: size, ready, creating, created, claimed, missed, replaced, failed_creates."""
        return self._pools.stats()

    async def get_sandbox(self, sandbox_id: str) -> AsyncSandboxInstance:
        record = await self._control.get(sandbox_id)
        return self._owned.get(sandbox_id) or AsyncSandboxInstance(self, record)

    async def list_sandboxes(self) -> list[SandboxRecord]:
        return await self._control.list()

    async def delete_sandbox(self, sandbox_id: str) -> None:
        instance = self._owned.pop(sandbox_id, None)
        if instance is not None:
            instance.stop_heartbeat()
        await self._control.delete(sandbox_id)

    async def list_snapshots(self) -> list[SnapshotRecord]:
        return await self._control.list_snapshots()

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Free a snapshot (SnapshotNotFound if there is none); sandboxes started from it go on."""
        self._snapshots.discard(snapshot_id)
        await self._control.delete_snapshot(snapshot_id)

    async def _delete_own_snapshots(self, control: SandboxControl) -> None:
        ids, self._snapshots = list(self._snapshots), set()
        results = await asyncio.gather(*(control.delete_snapshot(i) for i in ids), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, SnapshotNotFound):
                warnings.warn(f"orchard-gym: cannot delete a snapshot: {type(result).__name__}: {result}",
                              RuntimeWarning, stacklevel=2)

    async def cleanup_all(self) -> int:
        """Delete every sandbox this client created; returns how many."""
        ids = list(self._owned)
        results = await asyncio.gather(*(self.delete_sandbox(i) for i in ids), return_exceptions=True)
        return sum(1 for r in results if not isinstance(r, BaseException))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._pools.aclose()
            await self.cleanup_all()
            await self._delete_own_snapshots(self._control)
        finally:
            await self._control.aclose()
            _live_clients.discard(self)

    async def __aenter__(self) -> AsyncSandboxClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def _cleanup_at_exit(self) -> None:
        """Runs at interpreter exit: the user's loop may be gone, so use a fresh control."""
        ids = list(self._owned) + self._pools.idle_ids()
        if self._closed or not (ids or self._snapshots):
            return

        async def run():
            control = self._make_control()
            try:
                await asyncio.gather(*(control.delete(i) for i in ids), return_exceptions=True)
                await self._delete_own_snapshots(control)
            finally:
                await control.aclose()

        asyncio.run(run())
        self._owned.clear()


def backend_name_for(backend=None, base_url: str | None = None) -> str | None:
    """`AsyncSandboxClient(backend, base_url=base_url).backend_name` without making the client
    (which connects to its engine): the backend's name, None on an orchestrator or for a
    config the client would refuse (it says why when it is made)."""
    if backend is None and base_url is None:
        base_url = os.environ.get("ORCHARD_BASE_URL") or None
    if base_url:
        return None
    from orchard_gym.backends.base import Backend
    from orchard_gym.backends.config import parse_backend_config

    if backend is None:
        return "local"
    if isinstance(backend, Backend):
        return backend.name
    try:
        return getattr(parse_backend_config(backend), "type", None)
    except InvalidRequest:
        return None


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def _exec_request(command, timeout, cwd, env, stdin, login_shell, job_id=None) -> ExecRequest:
    return _validated(ExecRequest, command=command, timeout=timeout, cwd=cwd, env=env, stdin=stdin,
                      login_shell=login_shell, job_id=job_id)


def _validated(model, **fields):
    from pydantic import ValidationError

    try:
        return model(**fields)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'value'}: {err['msg']}" for err in e.errors())
        raise InvalidRequest(problems) from None


# --------------------------------------------------------------------------- sync twins


class SandboxInstance:
    """The synchronous twin of AsyncSandboxInstance."""

    def __init__(self, client: SandboxClient, inner: AsyncSandboxInstance):
        self._client, self._inner = client, inner
        self._run = client._loop.run

    sandbox_id = property(lambda self: self._inner.sandbox_id)
    id = property(lambda self: self._inner.sandbox_id)
    record = property(lambda self: self._inner.record)
    status = property(lambda self: self._inner.status)
    workdir = property(lambda self: self._inner.workdir)

    def __repr__(self) -> str:
        return f"<SandboxInstance {self.sandbox_id} {self.status}>"

    def exec(self, command, timeout: float = 600, cwd=None, env=None, stdin=None, login_shell=False,
             job_id=None, *, pty: bool = False, rows: int = 24, cols: int = 80) -> JobResult | PtyProcess:
        result = self._run(self._inner.exec(command, timeout, cwd, env, stdin, login_shell, job_id,
                                            pty=pty, rows=rows, cols=cols))
        return PtyProcess(result, self._run) if pty else result

    def shell(self, program=None, *, rows: int = 24, cols: int = 80, cwd=None, env=None) -> PtyProcess:
        return PtyProcess(self._run(self._inner.shell(program, rows=rows, cols=cols, cwd=cwd, env=env)), self._run)

    def exec_stream(self, command, timeout: float = 600, cwd=None, env=None, stdin=None,
                    login_shell=False, job_id=None) -> Iterator[ExecEvent]:
        agen = self._inner.exec_stream(command, timeout, cwd, env, stdin, login_shell, job_id)
        try:
            while True:
                try:
                    yield self._run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:  # stopped early: close the stream (that kills the command)
            self._run(agen.aclose())

    def cancel(self, job_id: str) -> bool:
        """Kill a running job; call it from another thread than the one in exec()."""
        return self._run(self._inner.cancel(job_id))

    def apply_patch(self, patch: str, timeout: float = 120, cwd=None) -> PatchResult:
        return self._run(self._inner.apply_patch(patch, timeout, cwd))

    def upload_content(self, content, remote_path: str, mode: int | None = None) -> dict:
        return self._run(self._inner.upload_content(content, remote_path, mode))

    def upload_file(self, local_path, remote_path: str, mode: int | None = None) -> dict:
        return self._run(self._inner.upload_file(local_path, remote_path, mode))

    def download_content(self, remote_path: str) -> bytes:
        return self._run(self._inner.download_content(remote_path))

    def download_file(self, remote_path: str, local_path) -> Path:
        return self._run(self._inner.download_file(remote_path, local_path))

    def list_files(self, path: str = ".") -> list[FileInfo]:
        return self._run(self._inner.list_files(path))

    def refresh(self) -> SandboxRecord:
        return self._run(self._inner.refresh())

    def wait_ready(self, timeout: float = DEFAULT_READY_TIMEOUT) -> SandboxRecord:
        return self._run(self._inner.wait_ready(timeout))

    def heartbeat(self) -> None:
        self._run(self._inner.heartbeat())

    def resources(self) -> dict:
        return self._run(self._inner.resources())

    def snapshot(self) -> SnapshotRecord:
        return self._run(self._inner.snapshot())

    def start_heartbeat(self, interval: float = 30.0) -> None:
        async def start():
            self._inner.start_heartbeat(interval)

        self._run(start())

    def stop_heartbeat(self) -> None:
        async def stop():
            self._inner.stop_heartbeat()

        self._run(stop())

    def delete(self) -> None:
        self._run(self._inner.delete())

    def __enter__(self) -> SandboxInstance:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.delete()
        except SandboxNotFound:
            pass


class SandboxClient:
    """The synchronous twin of AsyncSandboxClient (same arguments)."""

    def __init__(self, backend=None, *, base_url: str | None = None, api_key: str | None = None,
                 retry: RetryPolicy | None = None, cleanup_at_exit: bool = True, pool=None):
        self._loop = LoopThread.shared()
        parse_pools(pool)  # a bad pool spec raises here, in the caller's thread

        async def make():
            return AsyncSandboxClient(backend, base_url=base_url, api_key=api_key, retry=retry,
                                      cleanup_at_exit=False, pool=pool)

        self._async = self._loop.run(make())
        self._closed = False
        if cleanup_at_exit:
            _live_clients.add(self)
            _install_exit_cleanup()

    @property
    def backend(self):
        return self._async.backend

    def _wrap(self, inner: AsyncSandboxInstance) -> SandboxInstance:
        return SandboxInstance(self, inner)

    def create_sandbox(self, image=None, block_network: bool = True, sandbox_id=None, cpu=None, memory=None,
                       timeout: float = DEFAULT_READY_TIMEOUT, wait_ready: bool = True, env=None,
                       labels=None, from_snapshot: str | None = None, services=None,
                       disk: int | str | None = None) -> SandboxInstance:
        return self._wrap(self._loop.run(self._async.create_sandbox(
            image, block_network, sandbox_id, cpu, memory, timeout, wait_ready, env, labels, from_snapshot,
            services, disk)))

    def wait_pools(self, timeout: float = DEFAULT_READY_TIMEOUT) -> bool:
        return self._loop.run(self._async.wait_pools(timeout))

    def pool_stats(self) -> list[dict]:
        return self._async.pool_stats()

    def get_sandbox(self, sandbox_id: str) -> SandboxInstance:
        return self._wrap(self._loop.run(self._async.get_sandbox(sandbox_id)))

    def list_sandboxes(self) -> list[SandboxRecord]:
        return self._loop.run(self._async.list_sandboxes())

    def delete_sandbox(self, sandbox_id: str) -> None:
        self._loop.run(self._async.delete_sandbox(sandbox_id))

    def cleanup_all(self) -> int:
        return self._loop.run(self._async.cleanup_all())

    def list_snapshots(self) -> list[SnapshotRecord]:
        return self._loop.run(self._async.list_snapshots())

    def delete_snapshot(self, snapshot_id: str) -> None:
        self._loop.run(self._async.delete_snapshot(snapshot_id))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.run(self._async.aclose())
            _live_clients.discard(self)

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _cleanup_at_exit(self) -> None:
        if not self._closed:
            self._loop.run(self._async.cleanup_all(), timeout=60)
            self._loop.run(self._async._delete_own_snapshots(self._async._control), timeout=60)
            self._async._cleanup_at_exit()  # the idle pooled sandboxes


# --------------------------------------------------------------------------- exit cleanup

_cleanup_installed = False


def _cleanup_live_clients() -> None:
    for client in list(_live_clients):
        try:
            client._cleanup_at_exit()
        except Exception as e:  # keep going: other clients still need cleaning
            warnings.warn(f"orchard-gym: exit cleanup failed: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=1)


def _install_exit_cleanup() -> None:
    """Delete this process's sandboxes at exit, on SIGTERM too (which skips atexit)."""
    global _cleanup_installed
    if _cleanup_installed:
        return
    _cleanup_installed = True
    atexit.register(_cleanup_live_clients)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) == signal.SIG_DFL:
                signal.signal(sig, _exit_on_signal)


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through atexit, which cleans up
