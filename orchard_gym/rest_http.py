"""A small keep-alive HTTP/1.1 client for the orchestrator's JSON routes (remote.py).

Why not httpx here: every sandbox call through the orchestrator is one request, and
httpx's async stack (httpcore's pool, h11, anyio) costs ~0.5-0.8 ms of CPU per request on
a 2-core machine, work quadratic in the pool's connections (httpcore polls every idle
connection on each request) — as much as the orchestrator's own handling, on the same
cores. This client writes a request on an idle connection and reads a Content-Length or
chunked answer, nothing more. Streamed routes (exec/stream) stay on httpx.

It raises httpx's exception types, so the retry policy (retry.py) and remote.py's error
mapping treat it exactly as they treated httpx: ConnectError/ConnectTimeout (nothing sent:
always safe to retry), ReadError/RemoteProtocolError (sent: retried only if idempotent),
ReadTimeout.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import ssl as ssllib
from dataclasses import dataclass, field
from urllib.parse import urlencode, urlsplit

import httpx

from .agent_http import parse_head

CONNECT_TIMEOUT = 10.0


@dataclass
class RestResponse:
    status_code: int
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes = b""

    def json(self):
        return jsonlib.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    def usable(self) -> bool:
        return not (self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        self.writer.close()


class RestHTTP:
    """Requests to one orchestrator, at most `max_connections` at once (more wait for one)."""

    def __init__(self, base_url: str, headers: dict[str, str], *, max_connections: int = 100,
                 ssl: ssllib.SSLContext | None = None):
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.prefix = url.path.rstrip("/")
        self.ssl = (ssl or ssllib.create_default_context()) if url.scheme == "https" else None
        host = self.host if url.port is None else f"{self.host}:{url.port}"
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._fixed = f"Host: {host}\r\nAccept: application/json\r\n{extra}".encode("latin-1")
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Conn] = []
        self._closed = False

    async def _connect(self) -> _Conn:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None,
                    limit=1 << 20)
        except TimeoutError as e:
            raise httpx.ConnectTimeout(f"connecting to {self.host}:{self.port} timed out") from e
        except OSError as e:
            raise httpx.ConnectError(f"cannot connect to {self.host}:{self.port}: {e}") from e
        return _Conn(reader, writer)

    def _encode(self, method: str, path: str, params: dict | None, json_body) -> bytes:
        target = self.prefix + path
        if params:
            target += "?" + urlencode(params)
        head = f"{method} {target} HTTP/1.1\r\n".encode("latin-1") + self._fixed
        if json_body is None:
            return head + (b"Content-Length: 0\r\n\r\n" if method in ("POST", "PUT", "PATCH") else b"\r\n")
        body = jsonlib.dumps(json_body, separators=(",", ":")).encode()
        return head + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    async def request(self, method: str, path: str, *, json=None, params: dict | None = None,
                      timeout: float = 30.0) -> RestResponse:
        data = self._encode(method, path, params, json)
        async with self._slots:
            for attempt in (0, 1):
                conn, reused = None, False
                while self._idle and conn is None:
                    conn = self._idle.pop()
                    if not conn.usable():
                        conn.close()
                        conn = None
                reused = conn is not None
                if conn is None:
                    conn = await self._connect()
                try:
                    conn.writer.write(data)
                    async with asyncio.timeout(timeout):
                        await conn.writer.drain()
                        resp, keep = await self._read(conn, method)
                except TimeoutError as e:
                    conn.close()
                    raise httpx.ReadTimeout(f"no answer to {method} {path} within {timeout:g}s") from e
                except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
                    conn.close()
                    # an idle connection the server had closed meanwhile: once more on a fresh one
                    if reused and attempt == 0 and isinstance(e, asyncio.IncompleteReadError) and not e.partial:
                        continue
                    raise httpx.ReadError(f"connection to the orchestrator broke: {type(e).__name__}: {e}") from e
                except (asyncio.LimitOverrunError, ValueError) as e:
                    conn.close()
                    raise httpx.RemoteProtocolError(f"malformed answer from the orchestrator: {e}") from e
                except BaseException:  # cancelled mid-answer: the connection cannot be reused
                    conn.close()
                    raise
                if keep and not self._closed:
                    self._idle.append(conn)
                else:
                    conn.close()
                return resp
        raise AssertionError("unreachable")

    async def _read(self, conn: _Conn, method: str) -> tuple[RestResponse, bool]:
        raw = await conn.reader.readuntil(b"\r\n\r\n")
        head = parse_head(raw)
        if head is None:
            first = raw.split(b"\r\n", 1)[0].decode("latin-1")[:80]
            raise ValueError(f"not an HTTP response: {first!r}")
        version, status, headers = head
        keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        if method == "HEAD" or status in (204, 304) or status < 200:
            return RestResponse(status, headers), keep
        if "chunked" in headers.get("transfer-encoding", "").lower():
            chunks = []
            while True:
                size = int((await conn.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    while (await conn.reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                        pass
                    break
                chunks.append((await conn.reader.readexactly(size + 2))[:-2])
            body = b"".join(chunks)
        elif "content-length" in headers:
            length = int(headers["content-length"])
            body = await conn.reader.readexactly(length) if length else b""
        else:  # delimited by the end of the connection
            body, keep = await conn.reader.read(), False
        return RestResponse(status, headers, body), keep

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
