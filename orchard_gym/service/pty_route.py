"""`WS /sandboxes/{id}/exec/pty`: an interactive process, as Orchard Env's `exec(pty=True)` opens it.

The client sends the init frame first, then stdin/resize/signal/close frames; it gets
ready/stdout/exit/error frames (JSON text frames; the protocol is in orchard_gym/agent/ptys.py).
This replica opens the session on the sandbox's agent and relays frames both ways, parsing
each one (garbage gets an error frame and ends the session). When either side goes away the
other is closed, and the agent kills the command's process tree: a session never outlives
its client. The API key comes as `?api_key=` (what Orchard Env's SDK sends), an `X-API-Key`
header, or a `Sec-WebSocket-Protocol: api_key.<key>` offer. Refusals before the upgrade are
an error frame (with `error`, `status`, `detail` for typed exceptions), then a close code:
4401 no key, 4403 wrong key, 4404 no such sandbox, 4409 not running, 4422 a bad init.
"""

from __future__ import annotations

import asyncio
import json
import logging

from fastapi import APIRouter, HTTPException, WebSocket, WebSocketDisconnect

from orchard_gym.errors import OrchardError

from .errors import status_of

log = logging.getLogger(__name__)
router = APIRouter()
INIT_TIMEOUT = 30.0  # seconds for the client's init frame


def _key(ws: WebSocket) -> tuple[str | None, str | None]:
    """(the key, the subprotocol to accept when the key came as one)."""
    key = ws.query_params.get("api_key") or ws.headers.get("x-api-key")
    if key:
        return key, None
    for offer in ws.headers.get("sec-websocket-protocol", "").split(","):
        if offer.strip().startswith("api_key."):
            return offer.strip()[len("api_key."):], offer.strip()
    return None, None


def _frame(text) -> dict:
    """One client frame: a JSON object with a string `type`, else ValueError."""
    if not isinstance(text, str):
        raise ValueError("frames are JSON text frames, not binary")
    frame = json.loads(text)
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise ValueError("a frame is a JSON object with a string 'type'")
    return frame


async def _error(ws: WebSocket, message: str, code: int = 4400, **typed) -> None:
    try:
        await ws.send_text(json.dumps({"type": "error", "message": message, **typed}))
        await ws.close(code=code)
    except (RuntimeError, WebSocketDisconnect, OSError):
        pass


@router.websocket("/sandboxes/{sandbox_id}/exec/pty")
async def exec_pty(ws: WebSocket, sandbox_id: str) -> None:
    svc = ws.app.state.service
    key, subprotocol = _key(ws)
    # refusals come after the upgrade, as an error frame and a close code: a refused handshake
    # would reach the client as a bare HTTP 403, without the reason
    await ws.accept(subprotocol=subprotocol)
    try:
        caller = ws.app.state.keyring.caller(key)
    except HTTPException as e:
        name = "AuthenticationError"
        return await _error(ws, f"{name}: {e.detail}", 4000 + e.status_code, error=name, status=e.status_code,
                            detail=str(e.detail))
    record = await svc.store.get_sandbox(sandbox_id)
    if record is None or not caller.may_see(record):
        return await _error(ws, f"SandboxNotFound: no sandbox {sandbox_id!r}", 4404, error="SandboxNotFound",
                            status=404, detail=f"no sandbox {sandbox_id!r}")
    if record.status != "running":
        message = f"sandbox {sandbox_id} is {record.status}, not running"
        return await _error(ws, f"Conflict: {message}", 4409, error="SandboxFailed" if record.status == "failed"
                            else "InvalidRequest", status=409, detail=message)

    try:
        init = _frame(await asyncio.wait_for(ws.receive_text(), INIT_TIMEOUT))
    except TimeoutError:
        return await _error(ws, f"no init frame within {INIT_TIMEOUT:g}s", 4408)
    except (ValueError, KeyError) as e:  # KeyError: a binary frame where text was expected
        return await _error(ws, f"bad init frame: {e}", 4422, error="InvalidRequest", status=422,
                            detail=f"bad init frame: {e}")
    except WebSocketDisconnect:
        return
    try:
        channel = await svc.control.open_pty(sandbox_id, init)  # counts as a use: 404 gone, 409 failed
    except OrchardError as e:  # a bad init (the agent's 422), a dead sandbox, ...
        status, name = status_of(e)
        # `error`/`status`: for the SDK to raise the same typed exception as in-process
        return await _error(ws, f"{name}: {e}", 4000 + status, error=name, status=status, detail=str(e))
    await _relay(ws, channel, svc, sandbox_id)


async def _relay(ws: WebSocket, channel, svc, sandbox_id: str) -> None:
    async def client_to_agent() -> None:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            try:
                frame = _frame(message.get("text", message.get("bytes")))
            except ValueError as e:
                await _error(ws, f"bad frame: {e}")
                return
            await channel.send(frame)

    async def agent_to_client() -> None:
        while (frame := await channel.recv()) is not None:
            await ws.send_text(json.dumps(frame))

    async def keep_alive() -> None:  # a session in use keeps its sandbox from being reaped
        while True:
            await asyncio.sleep(max(0.1, svc.settings.sandbox_ttl / 3))
            try:
                await svc.store.touch(sandbox_id)
            except Exception:
                pass

    tasks = [asyncio.ensure_future(t()) for t in (client_to_agent, agent_to_client, keep_alive)]
    try:
        done, _ = await asyncio.wait(tasks[:2], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if not task.cancelled() and task.exception() is not None and \
                    not isinstance(task.exception(), (WebSocketDisconnect, OrchardError, OSError)):
                log.warning("pty session of %s: %r", sandbox_id, task.exception())
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await channel.aclose()  # the agent sees its connection end: it kills what still runs
        try:
            await ws.close()
        except (RuntimeError, OSError, WebSocketDisconnect):  # the client may have hung up first
            pass
