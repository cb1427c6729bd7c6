"""Interactive processes: a command on a pseudo-terminal in a sandbox (`exec(pty=True)`, `shell()`).

The frames are Orchard Env's (see orchard_gym/agent/ptys.py): the agent speaks them as JSON
lines on a connection it switched over (in-process backends), the orchestrator as WebSocket
text frames at `/sandboxes/{id}/exec/pty` (remote mode, and Orchard Env's own SDK). Either
way a `PtyChannel` carries them, and `AsyncPtyProcess` drives one: send, read, expect,
resize, kill, wait, close.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from abc import ABC, abstractmethod

from .errors import InvalidRequest, OrchardError, error_from_answer

SIGNALS = ("INT", "TERM", "KILL", "HUP", "QUIT")


class PtyError(OrchardError):
    """The session failed: the agent or orchestrator answered an error frame, or the connection broke."""


def init_frame(command: str | list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
               rows: int = 24, cols: int = 80, login_shell: bool = False) -> dict:
    """The first frame of a session (Orchard Env's `init`); checked here, so a mistake is an
    InvalidRequest before anything starts."""
    if isinstance(command, str):
        if not command.strip():
            raise InvalidRequest("command is empty")
    elif not (isinstance(command, list) and command and all(isinstance(a, str) for a in command)):
        raise InvalidRequest("command must be a non-empty string or a list of strings")
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10000:
            raise InvalidRequest(f"{name} must be an integer from 1 to 10000, not {value!r}")
    if env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise InvalidRequest("env must map strings to strings")
    return {"type": "init", "cmd": command, "env": env or {}, "cwd": cwd, "rows": rows, "cols": cols,
            "login_shell": bool(login_shell)}


class PtyChannel(ABC):
    """Frames (dicts) in both directions; `recv` answers None once the other side is done."""

    @abstractmethod
    async def send(self, frame: dict) -> None: ...

    @abstractmethod
    async def recv(self) -> dict | None: ...

    @abstractmethod
    async def aclose(self) -> None: ...


class LinesChannel(PtyChannel):
    """The agent's side: JSON lines on the connection it switched over (a 101 to POST /pty)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    async def send(self, frame: dict) -> None:
        try:
            self.writer.write(json.dumps(frame).encode() + b"\n")
            await self.writer.drain()
        except (OSError, RuntimeError) as e:
            raise PtyError(f"the terminal session's connection broke: {e}") from e

    async def recv(self) -> dict | None:
        try:
            line = await self.reader.readline()
        except (OSError, ValueError) as e:  # ValueError: a line past the reader's limit
            raise PtyError(f"the terminal session's connection broke: {e}") from e
        return json.loads(line) if line.strip() else None

    async def aclose(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass


class WebSocketChannel(PtyChannel):
    """The orchestrator's side: text frames of a WebSocket (the `websockets` library)."""

    def __init__(self, ws):
        self.ws = ws

    @classmethod
    async def connect(cls, url: str, init: dict, headers: dict[str, str] | None = None,
                      timeout: float = 30.0) -> WebSocketChannel:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus, WebSocketException

        try:
            ws = await connect(url, additional_headers=headers or {}, open_timeout=timeout,
                               max_size=16 << 20, ping_interval=20)
        except InvalidStatus as e:
            raise PtyError(f"the orchestrator refused the terminal session: HTTP {e.response.status_code}") from e
        except (OSError, TimeoutError, WebSocketException) as e:
            raise PtyError(f"cannot open the terminal session at {url.split('?')[0]}: {e}") from e
        channel = cls(ws)
        await channel.send(init)
        return channel

    async def send(self, frame: dict) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            await self.ws.send(json.dumps(frame))
        except ConnectionClosed as e:
            raise PtyError(f"the terminal session's connection closed: {e}") from e

    async def recv(self) -> dict | None:
        from websockets.exceptions import ConnectionClosed

        try:
            return json.loads(await self.ws.recv())
        except ConnectionClosed:
            return None

    async def aclose(self) -> None:
        await self.ws.close()


class AsyncPtyProcess:
    """A command on a terminal in a sandbox. Output is the terminal's (stdout and stderr
    merged, with the terminal's line endings: "\\r\\n"). Closing it (or leaving `async with`)
    ends the session, and the sandbox's agent kills the command's whole process tree."""

    def __init__(self, channel: PtyChannel):
        self._channel = channel
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self._buffer = b""  # read by read_until but not yet returned
        self._exited = asyncio.Event()
        self._ready = asyncio.Event()
        self.pid: int | None = None
        self.returncode: int | None = None
        self.error: str | None = None
        self._refusal: dict | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read_frames())

    @classmethod
    async def start(cls, channel: PtyChannel, timeout: float = 30.0) -> AsyncPtyProcess:
        proc = cls(channel)
        try:
            await asyncio.wait_for(proc._ready.wait(), timeout)
        except TimeoutError:
            await proc.close()
            raise PtyError(f"the terminal session did not start within {timeout:g}s") from None
        if proc.error is not None and proc.pid is None:
            await proc.close()
            if proc._refusal is not None:  # the orchestrator passed on a typed refusal (bad init, dead sandbox)
                raise error_from_answer(proc._refusal["status"], proc._refusal)
            raise PtyError(proc.error)
        return proc

    async def _read_frames(self) -> None:
        try:
            while True:
                frame = await self._channel.recv()
                if frame is None:
                    break
                kind = frame.get("type")
                if kind == "stdout":
                    self._chunks.put_nowait(base64.b64decode(frame.get("data", "")))
                elif kind == "ready":
                    self.pid = frame.get("pid")
                    self._ready.set()
                elif kind == "exit":
                    self.returncode = int(frame.get("code", -1))
                elif kind == "error":  # final, as for Orchard Env's client: what follows is not read
                    self.error = str(frame.get("message"))
                    if isinstance(frame.get("status"), int):
                        self._refusal = frame
                    break
        except (PtyError, ValueError) as e:
            self.error = self.error or str(e)
        finally:
            if self.returncode is None and self.error is None:
                self.error = "the terminal session ended without an exit status"
            self._chunks.put_nowait(b"")  # wakes a blocked read: the end
            self._exited.set()
            self._ready.set()

    # ------------------------------------------------------------------ input
    async def send(self, data: str | bytes) -> None:
        """Type `data` (a str is UTF-8 encoded; send "\\n" for Enter, "\\x03" for Ctrl-C)."""
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray)):
            raise InvalidRequest(f"send() takes str or bytes, not {type(data).__name__}")
        await self._send({"type": "stdin", "data": base64.b64encode(data).decode("ascii")})

    async def resize(self, rows: int, cols: int) -> None:
        init_frame("x", rows=rows, cols=cols)  # the same checks as at the start
        await self._send({"type": "resize", "rows": rows, "cols": cols})

    async def kill(self, sig: str = "KILL") -> None:
        """Signal the command's process group (INT, TERM, KILL, HUP or QUIT)."""
        name = str(sig).upper().removeprefix("SIG")
        if name not in SIGNALS:
            raise InvalidRequest(f"unknown signal {sig!r}; one of {', '.join(SIGNALS)}")
        if not self._exited.is_set():
            await self._send({"type": "signal", "sig": name})

    async def _send(self, frame: dict) -> None:
        if self._exited.is_set():
            raise PtyError(f"the process has ended ({self._end()})")
        await self._channel.send(frame)

    def _end(self) -> str:
        return self.error if self.returncode is None else f"exit status {self.returncode}"

    # ------------------------------------------------------------------ output
    async def read(self, timeout: float | None = None) -> bytes:
        """The next output; b"" once the process has ended and everything was read.
        TimeoutError when nothing comes within `timeout` seconds."""
        if self._buffer:
            data, self._buffer = self._buffer, b""
            return data
        if self._exited.is_set() and self._chunks.empty():
            return b""
        try:
            chunk = await asyncio.wait_for(self._chunks.get(), timeout)
        except TimeoutError:
            raise TimeoutError(f"no output within {timeout:g}s") from None
        if not chunk:
            self._chunks.put_nowait(b"")  # the end stays visible to later reads
        return chunk

    async def read_until(self, pattern: str | bytes | re.Pattern, timeout: float = 30.0) -> bytes:
        """Output up to and including the first match of `pattern` (a regex; str or bytes);
        what follows stays for the next read. TimeoutError (with what came) when it does not
        come in time, PtyError when the process ends first."""
        if isinstance(pattern, str):
            pattern = pattern.encode()
        regex = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        seen = self._buffer
        self._buffer = b""
        while True:
            match = regex.search(seen)
            if match:
                self._buffer = seen[match.end():]
                return seen[:match.end()]
            try:
                chunk = await self.read(max(0.0, deadline - loop.time()))
            except TimeoutError:
                self._buffer = seen
                raise TimeoutError(f"{regex.pattern!r} not seen within {timeout:g}s; got {seen[-300:]!r}") from None
            if not chunk:
                self._buffer = seen
                raise PtyError(f"the process ended ({self._end()}) before {regex.pattern!r}; got {seen[-300:]!r}")
            seen += chunk

    async def read_all(self, timeout: float | None = None) -> bytes:
        """Everything until the process ends."""
        out = []
        async with asyncio.timeout(timeout):
            while chunk := await self.read():
                out.append(chunk)
        return b"".join(out)

    # ------------------------------------------------------------------ end
    def poll(self) -> int | None:
        return self.returncode if self._exited.is_set() else None

    async def wait(self, timeout: float | None = None) -> int:
        """The exit status (negative: the signal that killed it). PtyError if the session
        failed instead; TimeoutError if it runs on past `timeout`."""
        try:
            await asyncio.wait_for(self._exited.wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"the process is still running after {timeout:g}s") from None
        if self.returncode is None:
            raise PtyError(f"terminal session failed: {self.error}")
        return self.returncode

    async def close(self) -> None:
        """End the session: the agent kills what still runs. Idempotent."""
        if not self._exited.is_set():
            try:
                await self._channel.send({"type": "close"})
            except PtyError:
                pass
        await self._channel.aclose()
        try:
            await asyncio.wait_for(asyncio.shield(self._reader), 5)
        except (TimeoutError, asyncio.CancelledError):
            self._reader.cancel()

    async def __aenter__(self) -> AsyncPtyProcess:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "running" if not self._exited.is_set() else self._end()
        return f"AsyncPtyProcess(pid={self.pid}, {state})"


class PtyProcess:
    """The blocking face of AsyncPtyProcess (what `SandboxInstance.exec(pty=True)` returns);
    the same methods, run on the client's event loop thread."""

    def __init__(self, inner: AsyncPtyProcess, run):
        self._inner, self._run = inner, run

    pid = property(lambda self: self._inner.pid)
    returncode = property(lambda self: self._inner.returncode)
    error = property(lambda self: self._inner.error)

    def send(self, data: str | bytes) -> None:
        self._run(self._inner.send(data))

    def resize(self, rows: int, cols: int) -> None:
        self._run(self._inner.resize(rows, cols))

    def kill(self, sig: str = "KILL") -> None:
        self._run(self._inner.kill(sig))

    def read(self, timeout: float | None = None) -> bytes:
        return self._run(self._inner.read(timeout))

    def read_until(self, pattern, timeout: float = 30.0) -> bytes:
        return self._run(self._inner.read_until(pattern, timeout))

    def read_all(self, timeout: float | None = None) -> bytes:
        return self._run(self._inner.read_all(timeout))

    def poll(self) -> int | None:
        return self._inner.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._run(self._inner.wait(timeout))

    def close(self) -> None:
        self._run(self._inner.close())

    def __enter__(self) -> PtyProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._inner).replace("AsyncPtyProcess", "PtyProcess")
