"""Service endpoints: a URL for a server running inside a sandbox (Orchard Env's `expose_service`).

    POST   /sandboxes/{id}/services {port, ttl_seconds?, wait_ready?, health_path?, ready_timeout?}
           -> {sandbox_id, port, url, expires_at}
    GET    /sandboxes/{id}/services          -> {sandbox_id, ports}
    DELETE /sandboxes/{id}/services/{port}   -> revoked at once, URLs that have not expired too
    ANY    /s/{token}/{path}                 the request, proxied to 127.0.0.1:port in the sandbox

The URL carries its credential (an HMAC-signed token naming the sandbox, the port and the
expiry), so clients that cannot send `X-API-Key` can use it: treat it as a bearer secret.
Each proxied request goes through the sandbox's agent (`POST /connect`, a byte tunnel from
inside the sandbox's network namespace), spoken as HTTP/1.1 with h11; the answer streams
back. Plain HTTP only: a WebSocket upgrade through a service URL is not proxied.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import time
import h11
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from orchard_gym.errors import InvalidRequest, OrchardError, SandboxNotFound, SandboxTimeout

from .auth import check_scope

router = APIRouter(dependencies=[Depends(check_scope)])
public = APIRouter()
HOP_HEADERS = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
               "transfer-encoding", "upgrade", "host", "x-api-key", "content-length"}
MAX_BODY = 64 << 20  # bytes of a proxied request body


class ServiceBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    port: int = Field(..., ge=1, le=65535)
    ttl_seconds: float | None = Field(None, gt=0, le=30 * 86400, allow_inf_nan=False)
    wait_ready: bool = False
    health_path: str = Field("/health", pattern=r"^/")
    ready_timeout: float = Field(60, gt=0, le=3600, allow_inf_nan=False)


def _secret(settings) -> bytes:
    if settings.service_secret:
        return settings.service_secret.encode()
    if settings.api_keys or settings.admin_keys:  # the same on replicas that share their keys
        keys = ",".join(sorted(settings.api_keys + settings.admin_keys))
        return hashlib.sha256(f"orchard-services:{settings.redis_prefix}:{keys}".encode()).digest()
    if not hasattr(_secret, "random"):  # no keys: one replica on loopback, any secret of its own
        _secret.random = os.urandom(32)
    return _secret.random


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def make_token(settings, sandbox_id: str, port: int, expires: float) -> str:
    claim = f"{sandbox_id}:{port}:{int(expires)}".encode()
    return _b64(claim) + "." + _b64(hmac.new(_secret(settings), claim, hashlib.sha256).digest())


def read_token(settings, token: str) -> tuple[str, int, float]:
    """(sandbox_id, port, expires) of a valid, unexpired token; else SandboxNotFound (404: says nothing)."""
    try:
        claim_b64, sig_b64 = token.split(".")
        claim = base64.urlsafe_b64decode(claim_b64 + "=" * (-len(claim_b64) % 4))
        sig = base64.urlsafe_b64decode(sig_b64 + "=" * (-len(sig_b64) % 4))
        if not hmac.compare_digest(sig, hmac.new(_secret(settings), claim, hashlib.sha256).digest()):
            raise ValueError("bad signature")
        sandbox_id, port, expires = claim.decode().rsplit(":", 2)
        if float(expires) < time.time():
            raise ValueError("expired")
        return sandbox_id, int(port), float(expires)
    except (ValueError, UnicodeDecodeError):
        raise SandboxNotFound("no such service endpoint (unknown, expired or revoked)") from None


def _exposed(record) -> dict[str, float]:
    now = time.time()
    return {p: exp for p, exp in record.details.get("services", {}).items() if exp > now}


async def _answer(svc, sandbox_id: str, port: int, method: str, target: str, headers: list[tuple[str, str]],
                  body: bytes, timeout: float = 300.0) -> tuple[int, list[tuple[str, str]], object]:
    """Send one request through a tunnel: (status, headers, an async iterator of the body)."""
    reader, writer = await svc.control.call(sandbox_id, "open_tunnel", port)
    conn = h11.Connection(h11.CLIENT)
    head = [("host", f"127.0.0.1:{port}"), ("connection", "close"), ("content-length", str(len(body))),
            *[(k, v) for k, v in headers if k.lower() not in HOP_HEADERS]]
    try:
        writer.write(conn.send(h11.Request(method=method, target=target, headers=head)) +
                     (conn.send(h11.Data(data=body)) if body else b"") + conn.send(h11.EndOfMessage()))
        await writer.drain()

        async def event():
            while True:
                ev = conn.next_event()
                if ev is not h11.NEED_DATA:
                    return ev
                conn.receive_data(await asyncio.wait_for(reader.read(1 << 16), timeout))

        response = await event()
        while isinstance(response, h11.InformationalResponse):
            response = await event()
        if not isinstance(response, h11.Response):
            raise OrchardError(f"the service on port {port} closed without answering")
    except BaseException:
        writer.close()
        raise

    async def chunks():
        try:
            while isinstance(ev := await event(), h11.Data):
                yield bytes(ev.data)
        finally:
            writer.close()

    out = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers
           if k.decode("latin-1").lower() not in HOP_HEADERS]
    return response.status_code, out, chunks()


@router.post("/sandboxes/{sandbox_id}/services", summary="expose a server in the sandbox at a URL")
async def expose(request: Request, sandbox_id: str, body: ServiceBody) -> dict:
    svc, settings = request.app.state.service, request.app.state.settings
    await svc.control.use(sandbox_id)
    expires = time.time() + (body.ttl_seconds or settings.service_ttl)
    if body.wait_ready:  # one request waits at most the server's max_wait, as every server-side wait
        await _wait_ready(svc, sandbox_id, body, min(body.ready_timeout, settings.max_wait))

    def add(record):
        record.details = {**record.details, "services": {**_exposed(record), str(body.port): expires}}

    if await svc.store.update_sandbox(sandbox_id, add) is None:
        raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
    token = make_token(settings, sandbox_id, body.port, expires)
    return {"sandbox_id": sandbox_id, "port": body.port, "url": f"{str(request.base_url).rstrip('/')}/s/{token}",
            "expires_at": int(expires)}


async def _wait_ready(svc, sandbox_id: str, body: ServiceBody, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            status, _, chunks = await _answer(svc, sandbox_id, body.port, "GET", body.health_path, [], b"", 5)
            async for _ in chunks:
                pass
            if status < 500:
                return
            last = f"HTTP {status}"
        except (OrchardError, OSError, TimeoutError, h11.ProtocolError) as e:
            last = str(e)
        await asyncio.sleep(0.2)
    raise SandboxTimeout(f"the service on port {body.port} did not answer {body.health_path} within "
                         f"{timeout:g}s ({last})")


@router.get("/sandboxes/{sandbox_id}/services", summary="the ports a sandbox exposes")
async def list_services(request: Request, sandbox_id: str) -> dict:
    record = await request.app.state.service.control.get(sandbox_id)
    return {"sandbox_id": sandbox_id, "ports": sorted(int(p) for p in _exposed(record))}


@router.delete("/sandboxes/{sandbox_id}/services/{port}", summary="stop exposing a port")
async def revoke(request: Request, sandbox_id: str, port: int) -> dict:
    if not 1 <= port <= 65535:
        raise InvalidRequest("port must be from 1 to 65535")
    def drop(record):
        record.details = {**record.details, "services": {p: e for p, e in _exposed(record).items() if p != str(port)}}

    if await request.app.state.service.store.update_sandbox(sandbox_id, drop) is None:
        raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
    return {"status": "revoked", "sandbox_id": sandbox_id, "port": port}


@public.api_route("/s/{token}/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"],
                  include_in_schema=False)  # any method, any path: the service's API, not ours
async def proxy(request: Request, token: str, path: str = "") -> Response:
    svc, settings = request.app.state.service, request.app.state.settings
    sandbox_id, port, _ = read_token(settings, token)
    record = await svc.store.get_sandbox(sandbox_id)
    if record is None or str(port) not in _exposed(record):
        raise SandboxNotFound("no such service endpoint (unknown, expired or revoked)")
    await svc.control.use(sandbox_id)
    body = await request.body()
    if len(body) > MAX_BODY:
        raise InvalidRequest(f"request body larger than {MAX_BODY} bytes")
    target = "/" + path + (f"?{request.url.query}" if request.url.query else "")
    try:
        status, headers, chunks = await _answer(svc, sandbox_id, port, request.method, target,
                                                list(request.headers.items()), body)
    except h11.ProtocolError as e:
        return Response(f"the service on port {port} answered malformed HTTP: {e}", status_code=502)
    except OrchardError as e:
        if "nothing answers" in str(e):
            return Response(str(e).split(": ", 1)[-1], status_code=502)
        raise
    response = StreamingResponse(chunks, status_code=status)
    # raw, so that repeated headers (several Set-Cookie) stay repeated
    response.raw_headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    return response


@public.api_route("/s/{token}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"],
                  include_in_schema=False)
async def proxy_root(request: Request, token: str) -> Response:
    return await proxy(request, token, "")
