"""The host's one hand-written HTTP/1.1 client (orchard_gym/http1.py; the agent client and the
orchestrator client's JSON routes) against real sockets: keep-alive reuse, chunked and
Content-Length bodies, a server that closed an idle connection, and garbage (bad URLs,
non-HTTP answers, answers cut short, a stranger's Server header, nobody listening), each
raised as the error type the retry policy knows (retry.py is_transient)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from orchard_gym.http1 import HTTP1Client, HTTPConnectError, HTTPProtocolError
from orchard_gym.retry import is_transient


async def _serve(handler):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _read_request(reader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head, await reader.readexactly(length) if length else b""


def test_bad_urls_are_refused():
    for url in ("ftp://x", "http://", "not a url", ""):
        with pytest.raises(ValueError, match="not an http"):
            HTTP1Client(base_url=url)


async def test_keep_alive_chunked_and_a_closed_idle_connection():
    connections, seen = [], []
    dropped = asyncio.Event()

    async def handler(reader, writer):
        connections.append(writer)
        try:
            while True:
                head, body = await _read_request(reader)
                seen.append((head.split(b"\r\n")[0], body))
                if b"/chunked" in head:
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 b"3\r\n{\"a\r\n5\r\n\": 1}\r\n0\r\n\r\n")
                elif b"/close-after" in head:  # answers, then drops the kept-alive connection
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                    await writer.drain()
                    writer.close()
                    await writer.wait_closed()
                    dropped.set()
                    return
                else:
                    writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 11\r\n\r\n{\"ok\": 42}\n")
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    server, url = await _serve(handler)
    http = HTTP1Client(base_url=url + "/prefix", headers={"X-API-Key": "k"})
    try:
        r = await http.request("POST", "/x", json={"n": 1}, params={"wait": "true"})
        assert r.status_code == 201 and r.json() == {"ok": 42}
        assert seen[0] == (b"POST /prefix/x?wait=true HTTP/1.1", b'{"n":1}')
        assert (await http.request("GET", "/chunked")).json() == {"a": 1}
        assert len(connections) == 1  # reused
        await http.request("GET", "/close-after")
        await asyncio.wait_for(dropped.wait(), 10)  # the server has closed the idle connection
        assert (await http.request("GET", "/y")).json() == {"ok": 42}  # a fresh connection, transparently
        assert len(connections) == 2
    finally:
        await http.aclose()
        server.close()


@pytest.mark.parametrize("answer, error", [
    (b"SSH-2.0-OpenSSH\r\n\r\n", "malformed"),  # not HTTP
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"cut", "broke"),  # cut short
    (b"HTTP/1.1 200 OK\r\nContent-Length: zebra\r\n\r\n", "malformed"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed"),  # bad chunk size
])
async def test_garbage_answers_raise_protocol_errors(answer, error):
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(answer)
        await writer.drain()
        writer.close()

    server, url = await _serve(handler)
    http = HTTP1Client(base_url=url)
    try:
        with pytest.raises(HTTPProtocolError, match=error) as info:
            await http.request("GET", "/")
        assert is_transient(info.value) and not is_transient(info.value, sent_is_safe=False)
    finally:
        await http.aclose()
        server.close()


async def test_nobody_listening_and_a_silent_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connection refused
    http = HTTP1Client(base_url=f"http://127.0.0.1:{port}")
    with pytest.raises(HTTPConnectError) as info:
        await http.request("GET", "/")
    assert is_transient(info.value, sent_is_safe=False)  # nothing was sent: always safe

    async def silent(reader, writer):
        await asyncio.sleep(5)

    server, url = await _serve(silent)
    http = HTTP1Client(base_url=url)
    try:
        with pytest.raises(TimeoutError):
            await http.request("GET", "/", timeout=0.2)
    finally:
        await http.aclose()
        server.close()


async def test_a_stranger_answering_is_refused():
    """A dead container's IP answered by another server: not taken for the agent."""
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    server, url = await _serve(handler)
    http = HTTP1Client(base_url=url, server="orchard-agent/", peer="the agent")
    try:
        with pytest.raises(HTTPProtocolError, match="not the agent answered"):
            await http.request("GET", "/health")
    finally:
        await http.aclose()
        server.close()
