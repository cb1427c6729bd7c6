"""The one wire error table (orchard_gym/errors.py WIRE_ERRORS): every error class a server
raises crosses real HTTP (the orchestrator's own error handlers under uvicorn, the SDK's
remote client) and comes out as the class the table names; garbage answers give a clear
error, never a crash or a class picked by the peer."""

from __future__ import annotations

import asyncio
import socket

import pytest
from components import require_module

from orchard_gym.errors import (
    ERRORS_BY_NAME,
    WIRE_ERRORS,
    OrchardError,
    error_from_agent,
    error_from_answer,
    error_from_job,
)
from orchard_gym.remote import RemoteControl
from orchard_gym.retry import RetryPolicy

require_module("server", "fastapi")
require_module("server", "uvicorn")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


GARBAGE = {  # route -> (status, content type, body)
    "html": (502, "text/html", b"<html><body>Bad Gateway</body></html>"),
    "list-name": (500, "application/json", b'{"error": ["SandboxNotFound"], "detail": "x"}'),
    "exit-name": (500, "application/json", b'{"error": "SystemExit", "detail": "bye"}'),
    "dunder-name": (404, "application/json", b'{"error": "__class__", "detail": "odd"}'),
    "bare-list": (422, "application/json", b'[1, 2, 3]'),
    "not-json-200": (200, "application/json", b"{not json"),
    "empty-503": (503, "text/plain", b""),
}


def _app():
    from fastapi import FastAPI
    from fastapi.responses import Response

    from orchard_gym.service.app import _install_error_handlers

    app = FastAPI()
    _install_error_handlers(app)
    by_class = {row.cls.__name__: row.cls for row in WIRE_ERRORS}

    @app.get("/sandboxes/{name}")
    async def raise_it(name: str):
        if name.startswith("garbage-"):
            status, ctype, body = GARBAGE[name.removeprefix("garbage-")]
            return Response(body, status_code=status, media_type=ctype)
        raise by_class[name](f"boom from {name}")

    return app


@pytest.fixture(scope="module")
def server():
    import threading

    import uvicorn

    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:  # a condition, polled: uvicorn has no ready event to wait on
        if not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        thread.join(0.01)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


async def _get(base_url: str, name: str):
    client = RemoteControl(base_url, retry=RetryPolicy(attempts=1), heartbeat=False)
    try:
        return await client.get(name)
    finally:
        await client.aclose()


@pytest.mark.parametrize("row", WIRE_ERRORS, ids=lambda r: r.cls.__name__)
def test_every_error_class_round_trips(server, row):
    expected = ERRORS_BY_NAME[row.name]
    with pytest.raises(BaseException) as info:
        asyncio.run(_get(server, row.cls.__name__))
    assert type(info.value) is expected, (row, info.value)
    assert f"boom from {row.cls.__name__}" in str(info.value)


@pytest.mark.parametrize("row", WIRE_ERRORS, ids=lambda r: r.cls.__name__)
def test_job_errors_round_trip(row):
    from orchard_gym.service.errors import job_error

    error = error_from_job(job_error(row.cls("no go")))
    assert type(error) is ERRORS_BY_NAME[row.name] and "no go" in str(error)


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_garbage_answers_give_a_clear_error(server, kind):
    status = GARBAGE[kind][0]
    with pytest.raises(OrchardError) as info:
        asyncio.run(_get(server, f"garbage-{kind}"))
    message = str(info.value)
    assert message, kind
    if status == 200:
        assert "not JSON" in message and "{not json" in message
    elif kind == "html":
        assert "Bad Gateway" in message


def test_a_peer_cannot_pick_any_class():
    # only the table's names are honoured; anything else falls back to the status
    for name in ("SystemExit", "KeyboardInterrupt", "builtins.OSError", "__class__", 5, None, ["x"], {"a": 1}):
        error = error_from_answer(500, {"error": name, "detail": "d"})
        assert type(error) is OrchardError, name
    assert type(error_from_job("SystemExit: bye")) is OrchardError
    huge = error_from_answer(502, "x" * 1_000_000)
    assert len(str(huge)) < 20_000


def test_agent_answers_by_status():
    assert type(error_from_agent(404, "no such file: /x")) is FileNotFoundError
    assert type(error_from_agent(404, "no such route: /y")).__name__ == "InvalidRequest"
    assert type(error_from_agent(401, "missing or wrong bearer token")).__name__ == "AuthenticationError"
    assert type(error_from_agent(413, "file too large")).__name__ == "FileTooLarge"
    assert str(error_from_agent(500, "Boom: x")) == "agent error 500: Boom: x"
