"""The host's one hand-written HTTP/1.1 client: keep-alive requests on asyncio streams, over
a unix socket or TCP (http or https), to the in-sandbox agent (agent_client.py) and to the
orchestrator's JSON routes (remote.py).

Why not httpx here: exec is the hot path of every rollout, and every sandbox call through
the orchestrator is one request. httpx's async stack (httpcore's pool, h11, anyio) costs
several times this client's CPU per request, on the same cores as the agent or the
orchestrator (scripts/bench_http.py; figures in docs/performance.md). Both peers speak a
narrow HTTP: Content-Length or chunked answers, and for the agent a streamed body, chunked
NDJSON lines and a protocol switch (101). httpx stays for the orchestrator's streamed exec
and everything else.

Errors: `HTTPConnectError` (nothing was sent: a retry is always safe), `HTTPProtocolError`
(sent, then the connection broke or the answer was malformed), `TimeoutError`.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import ssl as ssllib
from collections.abc import AsyncIterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from urllib.parse import urlencode, urlsplit

CONNECT_TIMEOUT = 10.0  # seconds
LIMIT = 1 << 20  # the stream reader's buffer: the longest head line we take


class HTTPConnectError(ConnectionError):
    """No connection could be made: nothing was sent, so a retry is always safe."""


class HTTPProtocolError(ConnectionError):
    """The connection broke or the answer was malformed after the request was sent."""


@dataclass
class Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def status_code(self) -> int:  # httpx's name
        return self.status

    @property
    def content(self) -> bytes:  # httpx's name
        return self.body

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self):
        return jsonlib.loads(self.body)


class ErrorAnswer(Exception):
    """A streamed or upgraded request was answered with an error instead."""

    def __init__(self, response: Response):
        super().__init__(response.status)
        self.response = response


def parse_head(raw: bytes) -> tuple[str, int, dict[str, str]] | None:
    """An HTTP/1.x response head -> (version, status, lower-cased headers); None if it is not one."""
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        return None
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    return parts[0], int(parts[1]), headers


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    def usable(self) -> bool:
        return not (self.reader.at_eof() or self.writer.is_closing())

    def close(self) -> None:
        self.writer.close()


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """The chunks of a chunked body, up to and including its trailers."""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            return
        yield (await reader.readexactly(size + 2))[:-2]


class BodyStream:
    """An answer body of known size, iterated in chunks; the connection goes back to the
    pool once it is read to the end, and is closed if the reader stops early."""

    CHUNK = 1 << 20

    def __init__(self, http: HTTP1Client, conn: _Conn, headers: dict[str, str], size: int, timeout: float):
        self._http, self._conn, self.headers, self.size, self._timeout = http, conn, headers, size, timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        left, done = self.size, False
        try:
            while left:
                async with asyncio.timeout(self._timeout):
                    chunk = await self._conn.reader.read(min(left, self.CHUNK))
                if not chunk:
                    raise HTTPProtocolError(f"{self._http.peer}'s answer ended {left} bytes early")
                left -= len(chunk)
                yield chunk
            done = True
        except ConnectionError as e:
            if isinstance(e, HTTPProtocolError):
                raise
            raise HTTPProtocolError(f"connection to {self._http.peer} broke: {type(e).__name__}: {e}") from e
        finally:
            if done:
                self._http._release(self._conn, _keep(self.headers))
            else:
                self._conn.close()


def _keep(headers: dict[str, str], version: str = "HTTP/1.1") -> bool:
    return headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"


class HTTP1Client:
    """Requests to one server, reusing idle connections.

    `uds`: a unix socket path (then `base_url` only names the host), else `base_url`
    (http or https; its path is a prefix of every request path). `headers` go with every
    request. At most `max_connections` requests at once (more wait), if given; at most
    `max_idle` idle connections kept. `server`: refuse answers whose Server header does not
    start with it (a dead container's IP may be answered by whatever holds it now).
    `peer` names the server in error messages."""

    def __init__(self, *, uds: str | None = None, base_url: str | None = None, headers: dict[str, str] | None = None,
                 max_connections: int | None = None, max_idle: int | None = None,
                 ssl: ssllib.SSLContext | None = None, server: str | None = None, peer: str = "the server"):
        if uds is None and base_url is None:
            raise ValueError("need a unix socket path or a base URL")
        self.uds, self.peer, self._server = uds, peer, server
        self.host, self.port, self.prefix, self.ssl = "localhost", 80, "", None
        if uds is None or base_url:
            url = urlsplit(base_url or "")
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError(f"not an http(s) URL: {base_url!r}")
            self.host = url.hostname
            self.port = url.port or (443 if url.scheme == "https" else 80)
            self.prefix = url.path.rstrip("/")
            if url.scheme == "https":
                self.ssl = ssl or ssllib.create_default_context()
            host = self.host if url.port is None else f"{self.host}:{url.port}"
        else:
            host = "localhost"
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._fixed = f"Host: {host}\r\n{extra}".encode("latin-1")
        self._slots = asyncio.Semaphore(max_connections) if max_connections else None
        self._max_idle = max_idle
        self._idle: list[_Conn] = []
        self._closed = False

    # ------------------------------------------------------------------ connections
    async def _connect(self) -> _Conn:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):  # a dead container's IP may never answer
                if self.uds:
                    reader, writer = await asyncio.open_unix_connection(self.uds, limit=LIMIT)
                else:
                    reader, writer = await asyncio.open_connection(
                        self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None,
                        limit=LIMIT)
        except (OSError, TimeoutError) as e:
            where = self.uds or f"{self.host}:{self.port}"
            raise HTTPConnectError(f"cannot connect to {self.peer} at {where}: {e or 'timed out'}") from e
        return _Conn(reader, writer)

    def _idle_conn(self) -> _Conn | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    def _release(self, conn: _Conn, keep: bool) -> None:
        if not keep or self._closed or (self._max_idle is not None and len(self._idle) >= self._max_idle):
            conn.close()
        else:
            self._idle.append(conn)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # ------------------------------------------------------------------ the wire
    def _encode(self, method: str, path: str, params: dict | None, body: bytes | None, ctype: str) -> bytes:
        target = self.prefix + path
        if params:
            target += "?" + urlencode(params)
        head = f"{method} {target} HTTP/1.1\r\n".encode("latin-1") + self._fixed
        if body is None:
            return head + (b"Content-Length: 0\r\n\r\n" if method in ("POST", "PUT", "PATCH") else b"\r\n")
        return head + b"Content-Type: %s\r\nContent-Length: %d\r\n\r\n" % (ctype.encode("latin-1"), len(body)) + body

    async def _send(self, data: bytes) -> tuple[_Conn, bool]:
        """Write a request on an idle connection (or a new one); says whether it was reused."""
        while (conn := self._idle_conn()) is not None:
            try:
                conn.writer.write(data)
                await conn.writer.drain()
                return conn, True
            except OSError:
                conn.close()
        conn = await self._connect()
        try:
            conn.writer.write(data)
            await conn.writer.drain()
        except OSError as e:
            conn.close()
            raise HTTPProtocolError(f"connection to {self.peer} broke while sending: {e}") from e
        return conn, False

    async def _read_head(self, conn: _Conn) -> tuple[str, int, dict[str, str]]:
        raw = await conn.reader.readuntil(b"\r\n\r\n")
        head = parse_head(raw)
        first = raw.split(b"\r\n", 1)[0].decode("latin-1")[:80]
        if head is None:
            raise ValueError(f"not an HTTP response: {first!r}")
        if self._server and not head[2].get("server", "").startswith(self._server):
            raise ValueError(f"not {self.peer} answered: {first!r}, server {head[2].get('server')!r}")
        return head

    async def _read_body(self, conn: _Conn, method: str, version: str, status: int,
                         headers: dict[str, str]) -> tuple[bytes, bool]:
        keep = _keep(headers, version)
        if method == "HEAD" or status in (204, 304) or status < 200:
            return b"", keep
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return b"".join([chunk async for chunk in _chunks(conn.reader)]), keep
        if "content-length" in headers:
            length = int(headers["content-length"])
            return (await conn.reader.readexactly(length) if length else b""), keep
        return await conn.reader.read(), False  # delimited by the end of the connection

    def _broke(self, conn: _Conn, e: BaseException) -> HTTPProtocolError:
        conn.close()
        if isinstance(e, HTTPProtocolError):
            return e
        if isinstance(e, (asyncio.LimitOverrunError, ValueError)):
            return HTTPProtocolError(f"malformed answer from {self.peer}: {e}")
        return HTTPProtocolError(f"connection to {self.peer} broke: {type(e).__name__}: {e}")

    # ------------------------------------------------------------------ requests
    async def request(self, method: str, path: str, *, params: dict | None = None, body: bytes | None = None,
                      json=None, ctype: str = "application/json", timeout: float = 30.0) -> Response:
        """One request; the whole answer. `json`: a body to send as compact JSON."""
        if json is not None:
            body = jsonlib.dumps(json, separators=(",", ":")).encode()
        data = self._encode(method, path, params, body, ctype)
        async with self._slots or nullcontext():
            for attempt in (0, 1):
                conn, reused = await self._send(data)
                try:
                    async with asyncio.timeout(timeout):
                        version, status, headers = await self._read_head(conn)
                        content, keep = await self._read_body(conn, method, version, status, headers)
                except TimeoutError:
                    conn.close()
                    raise
                except (asyncio.IncompleteReadError, OSError, asyncio.LimitOverrunError, ValueError) as e:
                    # an idle connection the server had closed meanwhile: once more on a fresh one
                    if reused and attempt == 0 and isinstance(e, asyncio.IncompleteReadError) and not e.partial:
                        conn.close()
                        continue
                    raise self._broke(conn, e) from e
                except BaseException:  # timeout or cancellation: the connection is mid-answer
                    conn.close()
                    raise
                self._release(conn, keep)
                return Response(status, headers, content)
        raise AssertionError("unreachable")

    async def request_stream(self, method: str, path: str, *, params: dict | None = None,
                             timeout: float = 300.0) -> tuple[Response | None, BodyStream | None]:
        """A bodiless request whose Content-Length answer body is read in chunks as it arrives.
        A 2xx: (None, BodyStream); anything else: (Response with its small body, None).
        `timeout` bounds the head and each chunk, not the whole body."""
        conn, _ = await self._send(self._encode(method, path, params, None, ""))
        try:
            async with asyncio.timeout(timeout):
                version, status, headers = await self._read_head(conn)
                size = int(headers.get("content-length", "0"))
                if status >= 300:
                    data = await conn.reader.readexactly(size) if size else b""
                    self._release(conn, _keep(headers, version))
                    return Response(status, headers, data), None
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError) as e:
            raise self._broke(conn, e) from e
        except BaseException:
            conn.close()
            raise
        return None, BodyStream(self, conn, headers, size, timeout)

    async def stream_lines(self, method: str, path: str, *, body: bytes, timeout: float) -> AsyncIterator[bytes]:
        """Send `body` and yield the lines of a chunked answer as they arrive. An answer that
        is not chunked (an error) raises ErrorAnswer."""
        conn, _ = await self._send(self._encode(method, path, None, body, "application/json"))
        try:
            async with asyncio.timeout(timeout):
                version, status, headers = await self._read_head(conn)
                if "chunked" not in headers.get("transfer-encoding", ""):
                    data, keep = await self._read_body(conn, method, version, status, headers)
                    self._release(conn, keep)
                    raise ErrorAnswer(Response(status, headers, data))
                pending = b""
                async for chunk in _chunks(conn.reader):
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        yield line
                if pending:
                    yield pending
        except ErrorAnswer:
            raise
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError) as e:
            raise self._broke(conn, e) from e
        except BaseException:
            conn.close()
            raise
        self._release(conn, _keep(headers, version))

    async def upgrade(self, path: str, body: bytes, timeout: float = 30.0) -> tuple[asyncio.StreamReader,
                                                                                  asyncio.StreamWriter]:
        """POST `body` to `path` on a connection of its own, which the server switches to
        another protocol (101): its streams. Any other answer raises ErrorAnswer."""
        conn = await self._connect()
        try:
            conn.writer.write(self._encode("POST", path, None, body, "application/json"))
            await conn.writer.drain()
            async with asyncio.timeout(timeout):
                version, status, headers = await self._read_head(conn)
                if status != 101:
                    data, _ = await self._read_body(conn, "POST", version, status, headers)
                    raise ErrorAnswer(Response(status, headers, data))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError) as e:
            raise self._broke(conn, e) from e
        except BaseException:
            conn.close()
            raise
        return conn.reader, conn.writer
