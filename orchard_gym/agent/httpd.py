"""Just enough HTTP/1.1 for the agent's JSON API, its routes, and the two servers."""

from __future__ import annotations

import base64
import json
import math
import os
import selectors
import signal
import socket
import socketserver
import threading
import time

try:  # constant-time comparison without importing hmac (and OpenSSL with it)
    from _operator import _compare_digest as compare_digest
except ImportError:  # pragma: no cover - other interpreters
    from hmac import compare_digest
try:  # the builtin SHA-256 (3.11: _sha256, 3.12+: _sha2): hashlib would load OpenSSL
    from _sha256 import sha256
except ImportError:  # pragma: no cover
    try:
        from _sha2 import sha256
    except ImportError:
        from hashlib import sha256

import ptys
import tunnel
from common import (CHUNK, DEFAULT_MAX_FILE, MAX_BODY, MAX_TIMEOUT, MIN_RATE, VERSION, BadRequest, _number,
                    _only_keys, _reject_constant, _typed)
from files import apply_patch, list_dir, open_regular, write_file
from jobs import Runner, kill_job

def parse_target(target: str) -> tuple[str, dict[str, str]]:
    """'/files?path=a%20b' -> ('/files', {'path': 'a b'}); the last value of a repeated key wins.
    (Not urllib.parse: it imports ipaddress, milliseconds per agent start.)"""
    path, _, query = target.partition("?")
    params = {}
    for pair in query.split("&"):
        if pair:
            key, _, value = pair.partition("=")
            params[_unquote(key)] = _unquote(value)
    return path, params


def _unquote(text: str) -> str:
    raw, i, data = text.replace("+", " ").encode("utf-8", "surrogateescape"), 0, bytearray()
    while i < len(raw):
        if raw[i] == 0x25 and _is_hex(raw[i + 1 : i + 3]):  # %XX
            data.append(int(raw[i + 1 : i + 3], 16))
            i += 3
        else:
            data.append(raw[i])
            i += 1
    return data.decode("utf-8", "replace")


def _is_hex(pair: bytes) -> bool:
    return len(pair) == 2 and all(c in b"0123456789abcdefABCDEF" for c in pair)



def _abs_path(path) -> str:
    """A file route's path: relative to the workdir, and (after `..` and every symlink are
    resolved) under the workdir or a --files-root; else 403. See docs/backends.md."""
    if not isinstance(path, str) or not path:
        raise BadRequest("path must be a non-empty string", 422)
    if "\0" in path:
        raise BadRequest("path contains a NUL byte", 422)
    full = os.path.abspath(os.path.join(Handler.runner.default_cwd, path))
    real = os.path.realpath(full)
    if not any(real == root or real.startswith(root.rstrip("/") + "/") for root in Handler.files_roots):
        raise BadRequest(f"path {path!r} resolves to {real}, outside the sandbox's file roots "
                         f"{Handler.files_roots} (use exec for other places)", 403)
    return real  # opened as resolved: a symlink swapped in afterwards is not followed again



PHRASES = {101: "Switching Protocols", 200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 409: "Conflict", 411: "Length Required", 413: "Payload Too Large",
           414: "URI Too Long", 422: "Unprocessable Entity", 431: "Request Header Fields Too Large",
           408: "Request Timeout", 500: "Internal Server Error", 501: "Not Implemented", 502: "Bad Gateway"}
MAX_LINE = 65536  # bytes in a request line or a header line
MAX_HEADERS = 100


class Headers(dict):
    """Request headers, looked up case-insensitively."""

    def get(self, key, default=None):
        return super().get(key.lower(), default)


class Watchdog:
    """Shuts down connections that pass their deadline: a client dribbling its headers a
    byte at a time (slowloris), a stalled upload, a reader that stopped reading. One
    thread for every connection, sleeping until the nearest deadline."""

    def __init__(self):
        self._cond = threading.Condition()
        self._deadlines: dict[socket.socket, float] = {}
        self._wake = math.inf  # when the thread wakes up next
        self._thread: threading.Thread | None = None

    def arm(self, sock: socket.socket, seconds: float) -> None:
        when = time.monotonic() + seconds
        with self._cond:
            self._deadlines[sock] = when
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True)
                self._thread.start()
            elif when < self._wake:
                self._cond.notify()

    def disarm(self, sock: socket.socket) -> None:
        with self._cond:
            self._deadlines.pop(sock, None)

    def _loop(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for sock, when in list(self._deadlines.items()):
                    if when <= now:
                        del self._deadlines[sock]
                        try:
                            sock.shutdown(socket.SHUT_RDWR)  # the blocked read or write returns
                        except OSError:
                            pass
                self._wake = min(self._deadlines.values(), default=math.inf)
                self._cond.wait(None if self._wake == math.inf else max(0.0, self._wake - now))


class HTTPHandler(socketserver.StreamRequestHandler):
    """Just enough HTTP/1.1 for the agent protocol: keep-alive, Content-Length bodies,
    chunked answers. Not http.server: its imports (http.client, email, ssl) cost about
    10 ms per agent start, a quarter of it, and the local backend starts many agents."""

    server_version = f"orchard-agent/{VERSION}"
    command = path = ""
    headers: Headers = Headers()
    close_connection = True

    watchdog = Watchdog()
    read_timeout = 60.0  # seconds for a request's head, plus MIN_RATE for its body
    idle_timeout = 600.0  # seconds a kept-alive connection may wait for its next request

    def handle(self) -> None:
        self.close_connection = False
        try:
            while not self.close_connection:
                if not self._read_request():
                    return
                self.watchdog.disarm(self.connection)  # a command may run long: no deadline
                self._dispatch(self.command)
                self.wfile.flush()
        finally:
            self.watchdog.disarm(self.connection)

    def guard(self, size: int = 0) -> None:
        """Give the next read or write of `size` bytes a deadline."""
        self.watchdog.arm(self.connection, self.read_timeout + size / MIN_RATE)

    def _read_request(self) -> bool:
        self.watchdog.arm(self.connection, self.idle_timeout)
        try:
            if not self.rfile.peek(1):  # waits for the first byte of the next request
                return False
        except OSError:
            return False
        self.guard()  # from its first byte, the whole head must arrive within read_timeout
        line = self.rfile.readline(MAX_LINE + 1)
        if not line:
            return False  # the client hung up between requests
        if len(line) > MAX_LINE:
            self.send_error(414, "request line too long")
            return False
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self.send_error(400, f"bad request line: {line[:80]!r}")
            return False
        self.command, self.path, version = parts
        self.headers = Headers()
        for _ in range(MAX_HEADERS):
            header = self.rfile.readline(MAX_LINE + 1)
            if not header:
                return False  # hung up (or cut off) before the head was complete
            if header in (b"\r\n", b"\n"):
                break
            name, sep, value = header.decode("latin-1").partition(":")
            if len(header) > MAX_LINE or not sep or not name.strip():
                self.send_error(400 if len(header) <= MAX_LINE else 431, "malformed header line")
                return False
            self.headers[name.strip().lower()] = value.strip()
        else:
            self.send_error(431, "too many headers")
            return False
        connection = self.headers.get("Connection", "").lower()
        self.close_connection = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
        return True

    def send_head(self, status: int, headers: list[tuple[str, str]]) -> bytes:
        lines = [f"HTTP/1.1 {status} {PHRASES.get(status, 'Unknown')}", f"Server: {self.server_version}"]
        lines += [f"{k}: {v}" for k, v in headers]
        if self.close_connection:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def send_error(self, code: int, message: str) -> None:
        """Errors of the request's framing: answered in JSON, then the connection closes."""
        self.close_connection = True
        try:
            self._json(code, {"error": message, "status": code})
        except OSError:
            pass


class Handler(HTTPHandler):
    runner: Runner
    token_sha256: bytes  # the token's digest; the token itself never reaches the sandbox
    started: float
    files_roots: list[str] = ["/"]
    max_file_size = DEFAULT_MAX_FILE

    # -- plumbing
    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj).encode())

    def _body_length(self) -> int:
        self._body_read = True
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise BadRequest("chunked request bodies are not supported", 411)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise BadRequest("bad Content-Length")
        if length < 0 or length > MAX_BODY:
            raise BadRequest("request body too large", 413)
        return length

    def _body_chunks(self):
        """The body in chunks as it arrives; raises when the client hangs up before its end."""
        left = self._body_length()
        self.guard(left)
        try:
            while left:
                chunk = self.rfile.read(min(left, CHUNK))
                if not chunk:
                    self.close_connection = True
                    raise BadRequest(f"the request body ended {left} bytes short of its Content-Length")
                left -= len(chunk)
                yield chunk
        finally:
            self.watchdog.disarm(self.connection)

    def _body(self) -> bytes:
        return b"".join(self._body_chunks())

    def _json_body(self) -> dict:
        raw = self._body()
        try:
            obj = json.loads(raw or b"null", parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"malformed JSON: {e}")
        if not isinstance(obj, dict):
            raise BadRequest("the body must be a JSON object", 422)
        return obj

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else ""
        return compare_digest(sha256(given.encode("utf-8", "surrogateescape")).digest(), self.token_sha256)

    def _dispatch(self, method: str) -> None:
        self._body_read = False
        path, query = parse_target(self.path)
        route = (method, path.rstrip("/") or "/")
        parts = route[1].split("/")
        if len(parts) == 4 and parts[1] == "jobs" and parts[3] == "cancel":  # /jobs/ID/cancel
            route, query["job_id"] = (method, "/jobs/*/cancel"), parts[2]
        handler = ROUTES.get(route)
        try:
            if handler is None:
                known = {p for _, p in ROUTES}
                if route[1] in known:
                    raise BadRequest(f"method {method} not allowed on {path}", 405)
                raise BadRequest(f"no such route: {path}", 404)
            if route != ("GET", "/health") and not self._authorized():
                raise BadRequest("missing or wrong bearer token", 401)
            handler(self, query)
        except BadRequest as e:
            self._safe_error(e.status, str(e))
        except FileNotFoundError as e:
            self._safe_error(404, f"no such file: {e.filename}")
        except IsADirectoryError as e:
            self._safe_error(409, f"is a directory: {e.filename}")
        except NotADirectoryError as e:
            self._safe_error(409, f"not a directory: {e.filename}")
        except PermissionError as e:
            self._safe_error(403, f"permission denied: {e.filename}")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # a bug: answer it rather than drop the connection
            self._safe_error(500, f"{type(e).__name__}: {e}")

    def _safe_error(self, status: int, message: str) -> None:
        if not self._body_read:
            self._discard_body()
        try:
            self._json(status, {"error": message, "status": status})
        except OSError:
            self.close_connection = True

    def _discard_body(self) -> None:
        """An unread body would be parsed as the next request: drain it or hang up."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if 0 <= length <= 1 << 20 and "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            try:
                self.rfile.read(length)
                return
            except OSError:
                pass
        self.close_connection = True

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        head = self.send_head(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
        self.guard(len(body))
        try:
            self.wfile.write(head + body)  # one write: one packet for small answers
        finally:
            self.watchdog.disarm(self.connection)

    # -- routes
    def health(self, query):
        self._json(200, {"status": "ok", "version": VERSION, "uptime": time.monotonic() - self.started,
                         "pid": os.getpid()})

    def exec_(self, query):
        self._json(200, self.runner.run(self._json_body(), client=self.connection))

    def exec_stream(self, query):
        req = self._json_body()
        max_output = _number(req, "max_output", self.runner.max_output, integer=True)
        job = self.runner.start(req)
        try:
            self._write(self.send_head(200, [("Content-Type", "application/x-ndjson"),
                                             ("Transfer-Encoding", "chunked")]))
            for name, data in self.runner.stream(job, max_output, self.connection):
                if name == "exit":
                    event = dict(data, type="exit")
                else:
                    event = {"type": name, "data": data.decode("utf-8", "replace")}
                line = json.dumps(event).encode() + b"\n"
                self._write(b"%x\r\n%s\r\n" % (len(line), line))
            self._write(b"0\r\n\r\n")
        except OSError:  # hung up, or a reader so slow the watchdog cut it off
            kill_job(job.proc, job.marker)  # nobody is listening any more
            self.close_connection = True

    def _write(self, data: bytes) -> None:
        self.guard(len(data))
        try:
            self.wfile.write(data)
            self.wfile.flush()
        finally:
            self.watchdog.disarm(self.connection)

    def jobs(self, query):
        with self.runner.lock:
            running = sorted(j for j, (proc, _) in self.runner.active.items() if proc is not None)
        self._json(200, {"jobs": running})

    def cancel(self, query):
        job_id = query["job_id"]
        self._json(200, {"job_id": job_id, "cancelled": self.runner.cancel(job_id)})

    def upload_json(self, query):
        req = self._json_body()
        _only_keys(req, {"path", "content", "mode", "encoding"})
        path = _abs_path(req.get("path"))
        content = req.get("content")
        if not isinstance(content, str):
            raise BadRequest("content must be a string", 422)
        if req.get("encoding", "base64") == "base64":
            try:
                data = base64.b64decode(content, validate=True)
            except ValueError:
                raise BadRequest("content is not valid base64", 422)
        elif req.get("encoding") == "utf-8":
            data = content.encode()
        else:
            raise BadRequest("encoding must be base64 or utf-8", 422)
        self._json(200, write_file(path, data, _mode(req.get("mode"))))

    def upload_raw(self, query):
        path = _abs_path(query.get("path"))
        mode = _mode(query.get("mode"))
        self._json(200, write_file(path, self._body_chunks(), mode))  # streamed to disk

    def download(self, query):
        fd, size = open_regular(_abs_path(query.get("path")), self.max_file_size)
        with open(fd, "rb", buffering=0) as f:
            if size == 0:  # procfs/sysfs files say 0 and have content: read them, bounded
                data = f.read(self.max_file_size + 1)
                if len(data) > self.max_file_size:
                    raise BadRequest(f"file too large: more than {self.max_file_size} bytes", 413)
                return self._send(200, data, "application/octet-stream")
            self._write(self.send_head(200, [("Content-Type", "application/octet-stream"),
                                             ("Content-Length", str(size))]))
            self.guard(size)
            try:
                sent = self.connection.sendfile(f, 0, size)  # kernel copy: no file in our memory
            finally:
                self.watchdog.disarm(self.connection)
            if sent != size:  # the file shrank while sent: the framing is broken, hang up
                self.close_connection = True

    def pty(self, query):  # the connection becomes the session (ptys.py)
        ptys.serve(self, self._json_body())

    def connect(self, query):  # the connection becomes a tunnel to a port in the sandbox (tunnel.py)
        tunnel.serve(self, self._json_body())

    def list_files(self, query):
        self._json(200, list_dir(_abs_path(query.get("path", "."))))

    def patch(self, query):
        req = self._json_body()
        _only_keys(req, {"patch", "cwd", "timeout"})
        patch = req.get("patch")
        if not isinstance(patch, str):
            raise BadRequest("patch must be a string", 422)
        timeout = _number(req, "timeout", 120, positive=True, maximum=MAX_TIMEOUT)
        cwd = _typed(req, "cwd", str, None)
        self._json(200, apply_patch(self.runner, patch, cwd and _abs_path(cwd), timeout))


def _mode(value) -> int | None:
    if value is None:
        return None
    try:
        mode = int(value, 8) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise BadRequest("mode must be an integer or an octal string", 422)
    if isinstance(value, bool) or not 0 <= mode <= 0o7777:
        raise BadRequest("mode out of range", 422)
    return mode


ROUTES = {
    ("GET", "/health"): Handler.health,
    ("POST", "/exec"): Handler.exec_,
    ("POST", "/exec/stream"): Handler.exec_stream,
    ("POST", "/files"): Handler.upload_json,
    ("PUT", "/files"): Handler.upload_raw,
    ("GET", "/files"): Handler.download,
    ("GET", "/files/list"): Handler.list_files,
    ("POST", "/patch"): Handler.patch,
    ("POST", "/pty"): Handler.pty,
    ("POST", "/connect"): Handler.connect,
    ("GET", "/jobs"): Handler.jobs,
    ("POST", "/jobs/*/cancel"): Handler.cancel,
}


class _AgentServer:
    def handle_error(self, request, client_address):  # a client hung up mid-request
        if os.environ.get("ORCHARD_AGENT_DEBUG"):
            super().handle_error(request, client_address)

    def serve_until_signalled(self) -> None:
        """Serve in the main thread until a signal handler ends the process.

        The kernel may hand SIGTERM to any of our threads; Python then only sets a flag that
        the main thread reads when it next runs, and socketserver's loop sleeps in select for
        its whole poll interval. A wakeup fd in the same select wakes the main thread at once,
        with no periodic polling by thousands of idle agents."""
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        with selectors.PollSelector() as selector:  # as socketserver: poll(2) holds no fd (epoll would)
            selector.register(self, selectors.EVENT_READ)
            selector.register(wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj is self:
                        self._handle_request_noblock()
                    else:  # the handler has run by now; what it did not end, we drain
                        os.read(wake_r, 4096)
                self.service_actions()


class UnixHTTPServer(_AgentServer, socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self):
        try:
            os.unlink(self.server_address)
        except FileNotFoundError:
            pass
        super().server_bind()
        os.chmod(self.server_address, 0o600)


class TCPHTTPServer(_AgentServer, socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().server_bind()
