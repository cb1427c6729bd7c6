"""A small keep-alive HTTP/1.1 client for the agent protocol, on asyncio streams.

Why not httpx here: exec is the hot path of every rollout, and httpx's async stack
(httpcore, h11, anyio) costs about 0.8 ms per call on a 2-core machine — more than
running `sh -c true` itself. The agent protocol is ours and narrow (JSON or raw
bodies with Content-Length; chunked NDJSON for streamed exec), so a plain client
over asyncio streams does the job in a tenth of the time. httpx stays in use for the
orchestrator's REST API, where it belongs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit


CONNECT_TIMEOUT = 10.0  # seconds


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


class AgentConnectError(ConnectionError):
    """No connection could be made: nothing was sent, so a retry is always safe."""


class AgentProtocolError(ConnectionError):
    """The connection broke or the answer was malformed after the request was sent."""


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        import json

        return json.loads(self.body)


class ErrorAnswer(Exception):
    """A streamed request was answered with an error instead of a stream."""

    def __init__(self, response: Response):
        super().__init__(response.status)
        self.response = response


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()


class BodyStream:
    """An answer body of known size, iterated in chunks; the connection goes back to the
    pool once it is read to the end, and is closed if the reader stops early."""

    CHUNK = 1 << 20

    def __init__(self, http: AgentHTTP, conn: _Conn, headers: dict[str, str], size: int, timeout: float):
        self._http, self._conn, self.headers, self.size, self._timeout = http, conn, headers, size, timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        left, done = self.size, False
        try:
            while left:
                async with asyncio.timeout(self._timeout):
                    chunk = await self._conn.reader.read(min(left, self.CHUNK))
                if not chunk:
                    raise AgentProtocolError(f"the agent's answer ended {left} bytes early")
                left -= len(chunk)
                yield chunk
            done = True
        except ConnectionError as e:
            if isinstance(e, AgentProtocolError):
                raise
            raise AgentProtocolError(f"agent connection broke: {type(e).__name__}: {e}") from e
        finally:
            if done:
                self._http._release(self._conn, self.headers)
            else:
                self._conn.close()


class AgentHTTP:
    """Requests to one agent, over a unix socket or TCP, reusing idle connections."""

    def __init__(self, *, uds: str | None = None, base_url: str | None = None, token: str, max_idle: int = 8):
        if uds is None and base_url is None:
            raise ValueError("need a unix socket path or a base URL")
        self.uds = uds
        if base_url:
            url = urlsplit(base_url)
            self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self._auth = f"Bearer {token}".encode()
        self._idle: list[_Conn] = []
        self._max_idle = max_idle
        self._closed = False

    async def _connect(self) -> _Conn:
        try:
            if self.uds:
                reader, writer = await asyncio.open_unix_connection(self.uds, limit=1 << 20)
            else:
                # bounded: a dead container's IP may route somewhere that never answers
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port, limit=1 << 20), CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as e:
            raise AgentConnectError(f"cannot connect to the agent: {e or 'timed out'}") from e
        return _Conn(reader, writer)

    def _head(self, method: str, path: str, params: dict | None, body: bytes | None, ctype: str) -> bytes:
        if params:
            path = f"{path}?{urlencode(params)}"
        lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: agent", b"Authorization: " + self._auth]
        if body is not None:
            lines += [f"Content-Type: {ctype}".encode(), f"Content-Length: {len(body)}".encode()]
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _send(self, method, path, params, body, ctype) -> tuple[_Conn, bool]:
        """Write the request on an idle connection (or a new one); says which it was."""
        head = self._head(method, path, params, body, ctype)
        while self._idle:
            conn = self._idle.pop()
            if conn.reader.at_eof() or conn.writer.is_closing():
                conn.close()
                continue
            try:
                conn.writer.write(head if body is None else head + body)
                await conn.writer.drain()
                return conn, True
            except OSError:
                conn.close()
        conn = await self._connect()
        try:
            conn.writer.write(head if body is None else head + body)
            await conn.writer.drain()
        except OSError as e:
            conn.close()
            raise AgentProtocolError(f"agent connection broke while sending: {e}") from e
        return conn, False

    async def _read_head(self, conn: _Conn) -> tuple[int, dict[str, str]]:
        raw = await conn.reader.readuntil(b"\r\n\r\n")
        head = parse_head(raw)
        first = raw.split(b"\r\n", 1)[0].decode("latin-1")[:80]
        if head is None:
            raise AgentProtocolError(f"not an HTTP response: {first!r}")
        _, status, headers = head
        if not headers.get("server", "").startswith("orchard-agent/"):
            # a dead container's IP can be answered by whatever now holds or routes it
            raise AgentProtocolError(f"not the agent answered: {first!r}, server {headers.get('server')!r}")
        return status, headers

    async def request(self, method: str, path: str, *, params: dict | None = None, body: bytes | None = None,
                      ctype: str = "application/json", timeout: float = 30.0) -> Response:
        for attempt in (0, 1):
            conn, reused = await self._send(method, path, params, body, ctype)
            try:
                async with asyncio.timeout(timeout):
                    status, headers = await self._read_head(conn)
                    length = int(headers.get("content-length", "0"))
                    data = await conn.reader.readexactly(length) if length else b""
            except (asyncio.IncompleteReadError, ConnectionError) as e:
                conn.close()
                # an idle connection the agent had already closed: one retry on a fresh one
                if reused and attempt == 0 and isinstance(e, asyncio.IncompleteReadError) and not e.partial:
                    continue
                raise AgentProtocolError(f"agent connection broke: {type(e).__name__}: {e}") from e
            except (asyncio.LimitOverrunError, ValueError) as e:
                conn.close()
                raise AgentProtocolError(f"malformed answer from the agent: {e}") from e
            except BaseException:  # timeout or cancellation: the connection is mid-answer
                conn.close()
                raise
            self._release(conn, headers)
            return Response(status, headers, data)
        raise AssertionError("unreachable")

    async def upgrade(self, path: str, body: bytes, timeout: float = 30.0) -> tuple[asyncio.StreamReader,
                                                                                  asyncio.StreamWriter]:
        """POST `body` to `path` on a connection of its own, which the agent switches to
        another protocol (101): its streams. Any other answer raises ErrorAnswer."""
        conn = await self._connect()
        try:
            conn.writer.write(self._head("POST", path, None, body, "application/json") + body)
            await conn.writer.drain()
            async with asyncio.timeout(timeout):
                status, headers = await self._read_head(conn)
                if status != 101:
                    length = int(headers.get("content-length", "0"))
                    data = await conn.reader.readexactly(length) if length else b""
                    raise ErrorAnswer(Response(status, headers, data))
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            conn.close()
            raise AgentProtocolError(f"agent connection broke: {type(e).__name__}: {e}") from e
        except BaseException:
            conn.close()
            raise
        return conn.reader, conn.writer

    async def request_stream(self, method: str, path: str, *, params: dict | None = None,
                             timeout: float = 300.0) -> tuple[Response | None, BodyStream | None]:
        """A bodiless request whose answer body is read in chunks as it arrives.
        A 2xx: (None, BodyStream); anything else: (Response with its small body, None).
        `timeout` bounds the head and each chunk, not the whole body."""
        conn, _ = await self._send(method, path, params, None, "")
        try:
            async with asyncio.timeout(timeout):
                status, headers = await self._read_head(conn)
                size = int(headers.get("content-length", "0"))
                if status >= 300:
                    data = await conn.reader.readexactly(size) if size else b""
                    self._release(conn, headers)
                    return Response(status, headers, data), None
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            conn.close()
            raise AgentProtocolError(f"agent connection broke: {type(e).__name__}: {e}") from e
        except (asyncio.LimitOverrunError, ValueError) as e:
            conn.close()
            raise AgentProtocolError(f"malformed answer from the agent: {e}") from e
        except BaseException:
            conn.close()
            raise
        return None, BodyStream(self, conn, headers, size, timeout)

    async def stream_lines(self, method: str, path: str, *, body: bytes, timeout: float) -> AsyncIterator[bytes]:
        """POST and yield the lines of a chunked answer as they arrive; raises on a 4xx/5xx."""
        conn, _ = await self._send(method, path, None, body, "application/json")
        try:
            async with asyncio.timeout(timeout):
                status, headers = await self._read_head(conn)
                if "chunked" not in headers.get("transfer-encoding", ""):
                    length = int(headers.get("content-length", "0"))
                    data = await conn.reader.readexactly(length) if length else b""
                    self._release(conn, headers)
                    raise ErrorAnswer(Response(status, headers, data))
                pending = b""
                while True:
                    size = int((await conn.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    if size == 0:
                        await conn.reader.readuntil(b"\r\n")
                        break
                    pending += (await conn.reader.readexactly(size + 2))[:-2]
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        yield line
                if pending:
                    yield pending
        except ErrorAnswer:
            raise
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            conn.close()
            raise AgentProtocolError(f"agent stream broke: {type(e).__name__}: {e}") from e
        except BaseException:
            conn.close()
            raise
        self._release(conn, headers)

    def _release(self, conn: _Conn, headers: dict[str, str]) -> None:
        if self._closed or headers.get("connection", "").lower() == "close" or len(self._idle) >= self._max_idle:
            conn.close()
        else:
            self._idle.append(conn)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
