"""The SDK's remote mode: `SandboxClient(base_url=..., api_key=...)` drives an orchestrator
(`orchard serve`) over its REST API, with the same typed errors as in-process.

Connection failures, connect/pool timeouts and 503s are retried with backoff (only
connection failures *before* sending for requests that are not idempotent); a 4xx never
is. Sandboxes this client created are heartbeated in the background while it lives, so
the orchestrator reaps them soon after the client dies.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
from collections.abc import AsyncIterator
from urllib.parse import quote

import httpx

from .control import SandboxControl
from .errors import (
    AgentUnavailable,
    InvalidRequest,
    JobNotFound,
    OrchardError,
    SandboxFailed,
    SandboxNotFound,
    SandboxTimeout,
    ServiceUnavailable,
    SnapshotNotFound,
    error_from_answer,
    error_from_job,
)
from .models import (ExecEvent, ExecRequest, FileInfo, JobResult, PatchResult, SandboxRecord, SandboxSpec,
                     SnapshotRecord, check_snapshot_id)
from .http1 import HTTP1Client, HTTPConnectError, HTTPProtocolError, Response
from .retry import RetryPolicy, retrying

error_for = error_from_answer  # the name this module gave it first (kept for callers)
SLACK = 30.0  # beyond a server-side wait, for the answer to travel
POOLS = 8


def _job_error(job: JobResult) -> BaseException | None:
    """A job that could not run at all (not a command that failed) carries 'Name: message'."""
    if job.status != "failed" or job.exit_code is not None or not job.error:
        return None
    return error_from_job(job.error)


class RemoteControl(SandboxControl):
    """Sandbox operations over an orchestrator's REST API."""

    def __init__(self, base_url: str, api_key: str | None = None, retry: RetryPolicy | None = None, *,
                 timeout: float = 30.0, heartbeat: bool = True, max_connections: int = 100):
        if not base_url.startswith(("http://", "https://")):
            raise InvalidRequest(f"base_url must be an http(s) URL, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        headers = {"X-API-Key": api_key} if api_key else {}
        self._headers = headers
        # httpcore's pool does work quadratic in its connections on every request, which
        # dominates at a few hundred requests in flight: spread them over a few small pools.
        # A request beyond a pool's size waits for a free connection (pool=None), never fails.
        per_pool = max(1, -(-max_connections // POOLS))
        # one TLS context for all pools (each would load the CA bundle again); none for http
        verify = ssl.create_default_context() if self.base_url.startswith("https://") else False
        self._pools = [
            httpx.AsyncClient(base_url=self.base_url, headers=headers, verify=verify,
                              timeout=httpx.Timeout(timeout, connect=10.0, pool=None),
                              limits=httpx.Limits(max_connections=per_pool, max_keepalive_connections=per_pool,
                                                  keepalive_expiry=30.0))
            for _ in range(POOLS)]  # streamed routes only (exec/stream): the JSON routes use _rest (http1.py)
        self._rest = HTTP1Client(base_url=self.base_url, headers={"Accept": "application/json", **headers},
                                 max_connections=max_connections, ssl=verify or None, peer="the orchestrator")
        self._next_pool = 0
        self._auto_heartbeat = heartbeat
        self._owned: set[str] = set()
        self._beat_interval: float | None = None
        self._beater: asyncio.Task | None = None

    # ------------------------------------------------------------------ plumbing
    async def _request(self, method: str, path: str, *, json_body=None, params: dict | None = None,
                       idempotent: bool = True, timeout: float | None = None) -> Response:
        try:
            async for attempt in retrying(self.retry, idempotent=idempotent):
                with attempt:
                    resp = await self._rest.request(method, path, json=json_body, params=params,
                                                    timeout=self.timeout if timeout is None else timeout)
                    if resp.status_code == 503:
                        raise error_for(503, _body(resp))  # ServiceUnavailable: retried
        except TimeoutError as e:
            raise SandboxTimeout(f"the orchestrator did not answer {method} {path} in time") from e
        except (HTTPConnectError, HTTPProtocolError) as e:
            raise ServiceUnavailable(f"cannot reach the orchestrator at {self.base_url}: "
                                     f"{type(e).__name__}: {e}") from e
        if resp.status_code >= 400:
            raise error_for(resp.status_code, _body(resp))
        return resp

    @property
    def _http(self) -> httpx.AsyncClient:
        """The next connection pool, round robin."""
        self._next_pool = (self._next_pool + 1) % len(self._pools)
        return self._pools[self._next_pool]

    def _timeout(self, seconds: float | None) -> httpx.Timeout:
        return httpx.Timeout(self.timeout if seconds is None else seconds, connect=10.0, pool=None)

    async def _json(self, method: str, path: str, **kw):
        resp = await self._request(method, path, **kw)
        try:
            return resp.json()
        except ValueError:  # not the orchestrator, or a proxy's page in front of it
            raise OrchardError(f"the answer to {method} {path} ({resp.status_code}) is not JSON: "
                               f"{resp.text[:200]!r}") from None

    @staticmethod
    def _p(sandbox_id: str) -> str:
        return f"/sandboxes/{quote(sandbox_id, safe='')}"

    def _record(self, data: dict) -> SandboxRecord:
        record = SandboxRecord.model_validate(data)
        expires = data.get("expires_at")
        if expires and self._beat_interval is None:
            self._beat_interval = max(0.2, (expires - record.last_heartbeat) / 3)
        return record

    # ------------------------------------------------------------------ lifecycle
    async def create(self, spec: SandboxSpec, wait_ready: bool, timeout: float) -> SandboxRecord:
        body = spec.model_dump(mode="json", exclude_none=True)
        wait_for = spec.timeout or timeout
        # with wait=true the server answers once the sandbox is ready: one round trip, not two
        record = self._record(await self._json(
            "POST", "/sandboxes", json_body=body, idempotent=False, params={"wait": "true"} if wait_ready else None,
            timeout=wait_for + SLACK if wait_ready else None))
        self._own(record.sandbox_id)
        if wait_ready and record.status != "running":
            try:
                record = await self.wait_ready(record.sandbox_id, wait_for)
            except BaseException:
                try:
                    await asyncio.shield(self.delete(record.sandbox_id))
                except Exception:
                    pass
                raise
        return record

    async def get(self, sandbox_id: str) -> SandboxRecord:
        return self._record(await self._json("GET", self._p(sandbox_id)))

    async def list(self) -> list[SandboxRecord]:
        return [self._record(d) for d in await self._json("GET", "/sandboxes")]

    async def wait_ready(self, sandbox_id: str, timeout: float) -> SandboxRecord:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                record = self._record(await self._json(
                    "GET", f"{self._p(sandbox_id)}/wait", params={"timeout": round(max(0.0, left), 3)},
                    timeout=max(0.0, left) + SLACK))
            except SandboxTimeout:
                if time.monotonic() >= deadline:
                    raise SandboxTimeout(f"sandbox {sandbox_id} not ready after {timeout:g}s") from None
                continue  # the server capped its wait: wait again
            if record.status == "failed":
                raise SandboxFailed(f"sandbox {sandbox_id} failed to start: {record.error}")
            if record.status == "running":
                return record
            if time.monotonic() >= deadline:
                raise SandboxTimeout(f"sandbox {sandbox_id} not ready after {timeout:g}s")

    async def delete(self, sandbox_id: str) -> None:
        self._owned.discard(sandbox_id)
        await self._request("DELETE", self._p(sandbox_id), idempotent=False)

    async def heartbeat(self, sandbox_id: str) -> None:
        await self._request("POST", f"{self._p(sandbox_id)}/heartbeat")

    async def resources(self, sandbox_id: str) -> dict:
        return await self._json("GET", f"{self._p(sandbox_id)}/resources")

    # ------------------------------------------------------------------ snapshots (service/snapshots.py)
    async def snapshot(self, sandbox_id: str) -> SnapshotRecord:
        return SnapshotRecord.model_validate(await self._json("POST", f"{self._p(sandbox_id)}/snapshots",
                                                              idempotent=False, timeout=600 + SLACK))

    async def delete_snapshot(self, snapshot_id: str) -> None:
        try:
            check_snapshot_id(snapshot_id)  # never a path: no request for garbage
        except ValueError as e:
            raise SnapshotNotFound(str(e)) from None
        await self._request("DELETE", f"/snapshots/{snapshot_id}", idempotent=False)

    async def list_snapshots(self) -> list[SnapshotRecord]:
        return [SnapshotRecord.model_validate(d) for d in await self._json("GET", "/snapshots")]

    # ------------------------------------------------------------------ commands
    @staticmethod
    def _exec_body(req: ExecRequest, wait: bool) -> dict:
        body = {"command": req.command, "timeout_seconds": req.timeout, "login_shell": req.login_shell,
                "wait": wait}
        for key in ("cwd", "env", "stdin", "job_id"):
            if getattr(req, key) is not None:
                body[key] = getattr(req, key)
        return body

    async def exec(self, sandbox_id: str, req: ExecRequest) -> JobResult:
        deadline = time.monotonic() + req.timeout + SLACK
        data = await self._json("POST", f"{self._p(sandbox_id)}/exec", json_body=self._exec_body(req, True),
                                idempotent=False, timeout=req.timeout + SLACK)
        job = JobResult.model_validate(data)
        while not job.is_complete:  # the server's wait ended first: keep waiting on the job
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxTimeout(f"job {job.job_id} still {job.status} after {req.timeout:g}s")
            try:
                job = JobResult.model_validate(await self._json(
                    "GET", f"/jobs/{job.job_id}/wait", params={"timeout": round(left, 3)}, timeout=left + SLACK))
            except SandboxTimeout:
                continue
        error = _job_error(job)
        if error is not None:
            raise error
        return job

    async def exec_stream(self, sandbox_id: str, req: ExecRequest) -> AsyncIterator[ExecEvent]:
        body = self._exec_body(req, False)
        body.pop("wait")
        timeout = self._timeout(req.timeout + SLACK)
        try:
            async with self._http.stream("POST", f"{self._p(sandbox_id)}/exec/stream", json=body,
                                         timeout=timeout) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    raise error_for(resp.status_code, _body(resp))
                async for line in resp.aiter_lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "error":
                        raise error_for(500, event)
                    yield ExecEvent.model_validate(event)
        except httpx.TimeoutException as e:
            raise SandboxTimeout("the orchestrator's stream timed out") from e
        except httpx.TransportError as e:
            raise AgentUnavailable(f"the stream from {self.base_url} broke: {type(e).__name__}: {e}") from e

    async def cancel(self, sandbox_id: str, job_id: str) -> bool:
        try:
            data = await self._json("POST", f"/jobs/{quote(job_id, safe='')}/cancel", idempotent=True)
        except JobNotFound:
            return False  # as in-process: not running (never started, or long gone)
        return bool(data.get("cancelled"))

    async def upload(self, sandbox_id: str, path: str, data: bytes, mode: int | None) -> dict:
        body = {"path": path, "content": base64.b64encode(data).decode()}
        if mode is not None:
            body["mode"] = mode
        return await self._json("POST", f"{self._p(sandbox_id)}/files", json_body=body, timeout=300)

    async def download(self, sandbox_id: str, path: str) -> bytes:
        data = await self._json("GET", f"{self._p(sandbox_id)}/files", params={"path": path}, timeout=300)
        return base64.b64decode(data["content"])

    async def open_pty(self, sandbox_id: str, init: dict):
        """A WebSocket to the orchestrator's /exec/pty (the key in a header, not the URL)."""
        from .terminal import WebSocketChannel

        url = "ws" + self.base_url[len("http"):] + f"{self._p(sandbox_id)}/exec/pty"
        return await WebSocketChannel.connect(url, init, headers=self._headers, timeout=self.timeout)

    async def list_files(self, sandbox_id: str, path: str) -> list[FileInfo]:
        data = await self._json("GET", f"{self._p(sandbox_id)}/files/list", params={"path": path})
        return [FileInfo.model_validate(f) for f in data["files"]]

    async def apply_patch(self, sandbox_id: str, patch: str, timeout: float, cwd: str | None) -> PatchResult:
        body = {"patch": patch, "timeout_seconds": timeout}
        if cwd:
            body["cwd"] = cwd
        return PatchResult.model_validate(await self._json(
            "POST", f"{self._p(sandbox_id)}/apply_patch", json_body=body, idempotent=False, timeout=timeout + SLACK))

    # ------------------------------------------------------------------ heartbeats
    def _own(self, sandbox_id: str) -> None:
        self._owned.add(sandbox_id)
        if self._auto_heartbeat and self._beater is None:
            self._beater = asyncio.get_running_loop().create_task(self._beat_forever())

    async def _beat_forever(self) -> None:
        limit = asyncio.Semaphore(16)

        async def beat(sandbox_id: str) -> None:
            async with limit:
                try:
                    await self._request("POST", f"{self._p(sandbox_id)}/heartbeat")
                except SandboxNotFound:
                    self._owned.discard(sandbox_id)
                except Exception:
                    pass  # transient: the next round tries again

        while True:
            await asyncio.sleep(self._beat_interval or 30.0)
            await asyncio.gather(*(beat(i) for i in list(self._owned)))

    async def aclose(self) -> None:
        if self._beater is not None:
            self._beater.cancel()
            try:
                await self._beater
            except (asyncio.CancelledError, Exception):
                pass
            self._beater = None
        await asyncio.gather(self._rest.aclose(), *(pool.aclose() for pool in self._pools), return_exceptions=True)


def _body(resp: httpx.Response | Response):
    try:
        return resp.json()
    except ValueError:
        return resp.text
