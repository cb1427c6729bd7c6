"""The orchestrator client's small HTTP/1.1 client (orchard_gym/rest_http.py) against real
sockets: keep-alive reuse, chunked and Content-Length bodies, a server that closed an idle
connection, and garbage (bad URLs, non-HTTP answers, answers cut short, nobody listening),
each raised as the httpx error type the retry policy already knows."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from orchard_gym.rest_http import RestHTTP


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
            RestHTTP(url, {})


async def test_keep_alive_chunked_and_a_closed_idle_connection():
    connections, seen = [], []

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
                    return
                else:
                    writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 11\r\n\r\n{\"ok\": 42}\n")
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    server, url = await _serve(handler)
    http = RestHTTP(url + "/prefix", {"X-API-Key": "k"})
    try:
        r = await http.request("POST", "/x", json={"n": 1}, params={"wait": "true"})
        assert r.status_code == 201 and r.json() == {"ok": 42}
        assert seen[0] == (b"POST /prefix/x?wait=true HTTP/1.1", b'{"n":1}')
        assert (await http.request("GET", "/chunked")).json() == {"a": 1}
        assert len(connections) == 1  # reused
        await http.request("GET", "/close-after")
        await asyncio.sleep(0.05)
        assert (await http.request("GET", "/y")).json() == {"ok": 42}  # a fresh connection, transparently
        assert len(connections) == 2
    finally:
        await http.aclose()
        server.close()


@pytest.mark.parametrize("answer, error", [
    (b"SSH-2.0-OpenSSH\r\n\r\n", httpx.RemoteProtocolError),  # not HTTP
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"cut", httpx.ReadError),  # cut short
    (b"HTTP/1.1 200 OK\r\nContent-Length: zebra\r\n\r\n", httpx.RemoteProtocolError),
])
async def test_garbage_answers_raise_httpx_errors(answer, error):
    async def handler(reader, writer):
        await _read_request(reader)
        writer.write(answer)
        await writer.drain()
        writer.close()

    server, url = await _serve(handler)
    http = RestHTTP(url, {})
    try:
        with pytest.raises(error):
            await http.request("GET", "/")
    finally:
        await http.aclose()
        server.close()


async def test_nobody_listening_and_a_silent_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connection refused
    http = RestHTTP(f"http://127.0.0.1:{port}", {})
    with pytest.raises(httpx.ConnectError):
        await http.request("GET", "/")

    async def silent(reader, writer):
        await asyncio.sleep(5)

    server, url = await _serve(silent)
    http = RestHTTP(url, {})
    try:
        with pytest.raises(httpx.ReadTimeout):
            await http.request("GET", "/", timeout=0.2)
    finally:
        await http.aclose()
        server.close()
