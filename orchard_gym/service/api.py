"""The REST API, compatible with Orchard Env's wire format (plus a streaming exec and
`/metrics`). Every route but `GET /` and `GET /health` needs an `X-API-Key` header."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from orchard_gym import __version__
from orchard_gym.errors import InvalidRequest
from orchard_gym.models import (Command, ExecRequest, JobId, JobResult, PatchResult, SandboxRecord,
                                SandboxSpec, Seconds, iso_mtime)

from .auth import caller_of, check_labels, check_scope, public_record
from .errors import status_of

# --------------------------------------------------------------------------- wire models
MAX_TIMEOUT = 7 * 86400
DEFAULT_EXEC_TIMEOUT = 600.0


class ExecBody(BaseModel):
    """`POST /sandboxes/{id}/exec` (and `/exec/stream`, which ignores `wait`)."""

    model_config = ConfigDict(extra="forbid")

    command: Command = Field(..., description="a shell string (bash -c) or an argv list")
    timeout_seconds: Seconds | None = Field(DEFAULT_EXEC_TIMEOUT, description=f"null: {DEFAULT_EXEC_TIMEOUT:g} s")
    cwd: str | None = None
    env: dict[str, str] | None = None
    stdin: str | None = None
    login_shell: bool = False
    wait: bool = Field(False, description="answer with the finished job instead of {job_id, status}")
    job_id: JobId | None = Field(None, description="the job's id (unique), to cancel it while it runs")

    @property
    def timeout(self) -> float:  # Orchard Env's SDK sends null when its caller gives none
        return DEFAULT_EXEC_TIMEOUT if self.timeout_seconds is None else self.timeout_seconds

    def request(self) -> ExecRequest:
        return ExecRequest(command=self.command, cwd=self.cwd, env=self.env, timeout=self.timeout,
                           stdin=self.stdin, login_shell=self.login_shell, job_id=self.job_id)


class PatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    patch: str
    timeout_seconds: Seconds = 120
    cwd: str | None = None


class UploadBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(..., min_length=1)
    content: str = Field(..., description="the file's bytes, base64")
    mode: int | None = Field(None, ge=0, le=0o7777, description="permission bits, e.g. 493 (0o755)")


class SandboxOut(SandboxRecord):
    """A sandbox record as the API shows it (no token, no backend internals), with the
    fields Orchard Env's SDK reads: `ready`, `namespace`, `timeout`, `status_message`."""

    model_config = ConfigDict(extra="ignore")

    expires_at: float | None = Field(None, description="when it is reaped unless heartbeated or used")
    ready: bool = Field(False, description="status is running: the agent answers")
    namespace: str | None = Field(None, description="the Kubernetes namespace (kubernetes backend), else the backend")
    timeout: float | None = Field(None, description="seconds it may take to become ready")
    status_message: str = Field("", description="why it failed, if it did")


class Deleted(BaseModel):
    status: str = "deleted"
    sandbox_id: str


class Queued(BaseModel):
    job_id: str
    status: str = "queued"


class Cancelled(BaseModel):
    job_id: str
    cancelled: bool = Field(..., description="false: the job was not running (finished, or unknown to its sandbox)")


class UploadOut(BaseModel):
    success: bool = True
    path: str
    size: int


class DownloadOut(BaseModel):
    path: str
    content: str = Field(..., description="base64")
    size: int


class FileOut(BaseModel):
    name: str
    type: str = Field(..., description="file, directory or symlink")
    size: int
    modified: str = Field(..., description="ISO 8601, UTC")


class ListOut(BaseModel):
    path: str
    files: list[FileOut]


class ErrorOut(BaseModel):
    detail: Any
    error: str = Field(..., description="the SDK's exception class, e.g. SandboxNotFound")


def _errors(*codes: int) -> dict:
    return {code: {"model": ErrorOut} for code in (401, 403, *codes)}


def _svc(request: Request):
    return request.app.state.service


def _out(request: Request, record: SandboxRecord) -> dict:
    """The record as `SandboxOut` has it, built directly: the hot routes answer with it
    unvalidated (tests/test_service.py checks it against the model)."""
    settings = request.app.state.settings
    data = public_record(record)  # env names only, no owner label
    data["details"] = {}  # backend internals: never shown
    data["expires_at"] = record.last_heartbeat + settings.sandbox_ttl
    data["ready"] = record.status == "running"
    data["namespace"] = record.details.get("namespace") or record.backend
    data["timeout"] = float(record.details.get("ready_timeout") or settings.ready_timeout)
    data["status_message"] = record.error or ""
    return data


def _json(data) -> Response:
    """Our own data as JSON, as it is: FastAPI validates a returned dict against the route's
    response model (which stays, for the OpenAPI schema) but not a returned Response."""
    return JSONResponse(data)


def _wait_for(request: Request, timeout: float) -> float:
    return min(timeout, request.app.state.settings.max_wait)


Timeout = Annotated[float, Query(ge=0, le=86400, allow_inf_nan=False,
                                  description="seconds to wait (capped by the server's max_wait)")]

# --------------------------------------------------------------------------- routes
public = APIRouter()
# authenticates, and 404s a {sandbox_id} or {job_id} the caller may not see (auth.py)
router = APIRouter(dependencies=[Depends(check_scope)])


@public.get("/", summary="banner")
async def banner(request: Request) -> dict:
    svc = _svc(request)
    return {"name": "orchard-gym orchestrator", "version": __version__, "backend": svc.backend.name,
            "store": svc.store.kind, "replica": svc.settings.replica_id, "docs": "/docs"}


@public.get("/health", summary="liveness")
async def health(request: Request) -> dict:
    svc = _svc(request)
    store_ok = await svc.store.ping()
    return {"status": "ok" if store_ok else "degraded", "store": "ok" if store_ok else "unreachable",
            "replica": svc.settings.replica_id}


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    svc = _svc(request)
    svc.metrics.execs_running.set(svc.control.jobs.running)
    svc.metrics.execs_waiting.set(svc.control.jobs.waiting)
    counts: dict[str, int] = {}
    for record in await svc.store.list_sandboxes():
        counts[record.status] = counts.get(record.status, 0) + 1
    for status in ("pending", "running", "failed", "deleting"):
        svc.metrics.sandboxes.labels(status).set(counts.get(status, 0))
    return Response(svc.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/resources", summary="capacity and usage of the backend", responses=_errors())
async def resources(request: Request) -> dict:
    svc = _svc(request)
    counts: dict[str, int] = {}
    for record in await svc.store.list_sandboxes():
        counts[record.status] = counts.get(record.status, 0) + 1
    return {
        "backend": svc.backend.resources(),
        "sandboxes": {"total": sum(counts.values()), **counts},
        "execs": {"running": svc.control.jobs.running, "waiting": svc.control.jobs.waiting,
                  "concurrency": svc.settings.exec_concurrency, "queue": svc.settings.exec_queue},
        "replica": svc.settings.replica_id,
        "store": svc.store.kind,
        "pools": svc.control.pools.stats() if svc.control.pools is not None else [],
    }


@router.post("/sandboxes", summary="create a sandbox", response_model=SandboxOut, responses=_errors(409, 422, 503))
async def create_sandbox(request: Request, spec: SandboxSpec,
                         wait: Annotated[bool, Query(description="answer once it is ready (or failed), "
                                                     "within the server's max_wait")] = False) -> Response:
    svc = _svc(request)
    check_labels(spec.labels)
    if spec.from_snapshot is not None:  # someone else's snapshot is a missing one (snapshots.py)
        from .snapshots import visible_snapshot
        await visible_snapshot(request, caller_of(request), spec.from_snapshot)
    timeout = _wait_for(request, spec.timeout or svc.settings.ready_timeout)
    return _json(_out(request, await svc.control.create(spec, wait, timeout, owner=caller_of(request).owner)))


@router.get("/sandboxes", summary="list sandboxes", response_model=list[SandboxOut], responses=_errors())
async def list_sandboxes(request: Request) -> Response:
    caller = caller_of(request)
    return _json([_out(request, r) for r in await _svc(request).control.list() if caller.may_see(r)])


@router.get("/sandboxes/{sandbox_id}", response_model=SandboxOut, responses=_errors(404))
async def get_sandbox(request: Request, sandbox_id: str) -> Response:
    return _json(_out(request, await _svc(request).control.get(sandbox_id)))


@router.delete("/sandboxes/{sandbox_id}", response_model=Deleted, responses=_errors(404))
async def delete_sandbox(request: Request, sandbox_id: str) -> Response:
    await _svc(request).control.delete(sandbox_id)
    return _json({"status": "deleted", "sandbox_id": sandbox_id})


@router.get("/sandboxes/{sandbox_id}/resources", summary="limits, kill method and usage of one sandbox",
            responses=_errors(404))
async def sandbox_resources(request: Request, sandbox_id: str) -> Response:
    return _json(await _svc(request).control.resources(sandbox_id))


@router.get("/sandboxes/{sandbox_id}/wait", summary="block until the sandbox is ready (or failed)",
            response_model=SandboxOut, responses=_errors(404, 408))
async def wait_sandbox(request: Request, sandbox_id: str, timeout: Timeout = 30.0) -> Response:
    # a wait on readiness holds nothing but this request: it may be as long as creating takes
    timeout = min(timeout, request.app.state.settings.max_ready_wait)
    return _json(_out(request, await _svc(request).control.wait_ready(sandbox_id, timeout)))


@router.post("/sandboxes/{sandbox_id}/heartbeat", summary="refresh the liveness timer",
             response_model=SandboxOut, responses=_errors(404))
async def heartbeat(request: Request, sandbox_id: str) -> Response:
    return _json(_out(request, await _svc(request).control.heartbeat(sandbox_id)))


@router.post("/sandboxes/{sandbox_id}/exec", summary="run a command",
             response_model=JobResult | Queued, responses=_errors(404, 409, 422, 502, 503))
async def exec_command(request: Request, sandbox_id: str, body: ExecBody) -> Response:
    wait_timeout = _wait_for(request, body.timeout + 5.0)
    job = await _svc(request).control.jobs.submit(sandbox_id, body.request(), body.wait, wait_timeout)
    if not body.wait:
        return JSONResponse({"job_id": job.job_id, "status": "queued"})
    return Response(job.public_json(), media_type="application/json")


@router.post("/sandboxes/{sandbox_id}/exec/stream", summary="run a command, streaming its output (NDJSON)",
             responses={**_errors(404, 409, 422, 503),
                        200: {"content": {"application/x-ndjson": {}},
                              "description": "lines of {type: stdout|stderr, data} ... {type: exit, exit_code, ...}"}})
async def exec_stream(request: Request, sandbox_id: str, body: ExecBody) -> StreamingResponse:
    events = await _svc(request).control.jobs.stream(sandbox_id, body.request())

    async def lines():
        try:
            async for event in _until_disconnected(request, events):
                yield event.model_dump_json(exclude_none=True).encode() + b"\n"
        except Exception as e:  # headers are gone: say it in-band
            _, name = status_of(e)
            yield json.dumps({"type": "error", "error": name, "detail": str(e)}).encode() + b"\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


async def _until_disconnected(request: Request, events):
    """The events, until the client hangs up: then the task reading the agent's stream is
    cancelled (which closes that connection), so the agent kills the command. Starlette
    alone notices a hang-up only at its next write, which a silent command may never make.
    One task reads the whole stream (its locks and timeouts belong to one task)."""
    queue: asyncio.Queue = asyncio.Queue(maxsize=1)
    end = object()

    async def pump() -> None:
        try:
            async for event in events:
                await queue.put((event, None))
        except Exception as e:
            await queue.put((end, e))
            return
        await queue.put((end, None))

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    reader, watcher = asyncio.ensure_future(pump()), asyncio.ensure_future(gone())
    try:
        while True:
            item = asyncio.ensure_future(queue.get())
            await asyncio.wait({item, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not item.done():  # hung up
                item.cancel()
                return
            event, error = item.result()
            if error is not None:
                raise error
            if event is end:
                return
            yield event
    finally:
        watcher.cancel()
        reader.cancel()
        await asyncio.gather(reader, watcher, return_exceptions=True)


@router.get("/jobs/{job_id}", response_model=JobResult, responses=_errors(404))
async def get_job(request: Request, job_id: str) -> Response:
    return Response((await _svc(request).control.jobs.get_job(job_id)).public_json(), media_type="application/json")


@router.get("/jobs/{job_id}/wait", summary="block until the job is complete", response_model=JobResult,
            responses=_errors(404, 408))
async def wait_job(request: Request, job_id: str, timeout: Timeout = 30.0) -> Response:
    job = await _svc(request).control.jobs.wait_job(job_id, _wait_for(request, timeout))
    return Response(job.public_json(), media_type="application/json")


@router.post("/jobs/{job_id}/cancel", summary="kill a running job", response_model=Cancelled,
             responses=_errors(404, 502))
async def cancel_job(request: Request, job_id: str) -> dict:
    return {"job_id": job_id, "cancelled": await _svc(request).control.jobs.cancel(job_id)}


@router.post("/sandboxes/{sandbox_id}/apply_patch", response_model=PatchResult,
             responses=_errors(404, 409, 422, 502, 503))
async def apply_patch(request: Request, sandbox_id: str, body: PatchBody) -> PatchResult:
    return await _svc(request).control.apply_patch(sandbox_id, body.patch, body.timeout_seconds, body.cwd)


@router.post("/sandboxes/{sandbox_id}/files", summary="upload a file", response_model=UploadOut,
             responses=_errors(404, 409, 422, 502))
async def upload(request: Request, sandbox_id: str, body: UploadBody) -> dict:
    try:
        data = base64.b64decode(body.content, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("content is not valid base64") from None
    answer = await _svc(request).control.upload(sandbox_id, body.path, data, body.mode)
    return {"success": True, "path": answer.get("path", body.path), "size": answer.get("size", len(data))}


@router.get("/sandboxes/{sandbox_id}/files", summary="download a file", response_model=DownloadOut,
            responses=_errors(404, 409, 422, 502))
async def download(request: Request, sandbox_id: str, path: Annotated[str, Query(min_length=1)]) -> Response:
    # the agent's refusals (404, 413 too large, 422 not a regular file) surface here, before any byte
    size, chunks = await _svc(request).control.download_stream(sandbox_id, path)

    async def body():  # the same JSON as ever, made as the file arrives: nothing holds it whole
        yield b'{"path": ' + json.dumps(path).encode() + b', "size": %d, "content": "' % size
        rest = b""
        async for chunk in chunks:
            chunk = rest + chunk
            cut = len(chunk) - len(chunk) % 3  # base64 of whole 3-byte groups joins up cleanly
            rest = chunk[cut:]
            yield base64.b64encode(chunk[:cut])
        yield base64.b64encode(rest) + b'"}'

    return StreamingResponse(body(), media_type="application/json")


@router.get("/sandboxes/{sandbox_id}/files/list", summary="list a directory", response_model=ListOut,
            responses=_errors(404, 409, 422, 502))
async def list_files(request: Request, sandbox_id: str, path: str = ".") -> dict:
    files = await _svc(request).control.list_files(sandbox_id, path)
    return {"path": path, "files": [{**f.model_dump(), "modified": iso_mtime(f.modified)} for f in files]}


# FastAPI tries a router's routes in order on every request: the hot ones (a rollout's
# create, exec, wait, usage read and delete) go first. No two paths here overlap, so the
# order changes which route is tried first, never which one matches.
_HOT = ("/sandboxes/{sandbox_id}/exec", "/sandboxes", "/sandboxes/{sandbox_id}", "/jobs/{job_id}/wait",
        "/sandboxes/{sandbox_id}/resources", "/sandboxes/{sandbox_id}/wait")
router.routes.sort(key=lambda r: _HOT.index(r.path) if getattr(r, "path", None) in _HOT else len(_HOT))
