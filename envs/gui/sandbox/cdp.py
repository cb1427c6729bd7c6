"""A minimal Chrome DevTools Protocol client (standard library only) for the GUI daemon.

Chromium listens on 127.0.0.1 inside the sandbox's own network namespace; the daemon
reads page state through it (URL, title, tabs, the DOM for oracles, MiniWoB's reward)
and navigates (goto, new_tab, tab_focus). Nothing in here clicks or types: input goes
through the X server like a user's.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
import urllib.request


class CDPError(RuntimeError):
    pass


def http_json(port: int, path: str, method: str = "GET", timeout: float = 5.0):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    with urllib.request.urlopen(req, timeout=timeout) as r:  # loopback only
        body = r.read()
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


class Session:
    """A websocket to one page target; `call(method, params)` returns the result."""

    def __init__(self, ws_url: str, timeout: float = 10.0):
        rest = ws_url.split("://", 1)[1]
        hostport, path = rest.split("/", 1)
        host, port = hostport.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise CDPError("the DevTools socket closed during the handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise CDPError(f"DevTools refused the websocket: {head[:200]!r}")
        self.buf = head.split(b"\r\n\r\n", 1)[1]
        self.next_id = 0

    def _send(self, text: str) -> None:
        data = text.encode()
        mask = os.urandom(4)
        n = len(data)
        header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else
                                  bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 else
                                  bytes([0x80 | 127]) + struct.pack(">Q", n))
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(header + mask + masked)

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise CDPError("the DevTools socket closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _recv(self) -> str:
        parts = []
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(n)
            opcode = b0 & 0x0F
            if opcode == 8:
                raise CDPError("the DevTools socket was closed by the browser")
            if opcode in (0, 1, 2):
                parts.append(payload)
                if b0 & 0x80:
                    return b"".join(parts).decode(errors="replace")

    def call(self, method: str, params: dict | None = None) -> dict:
        self.next_id += 1
        my_id = self.next_id
        self._send(json.dumps({"id": my_id, "method": method, "params": params or {}}))
        while True:
            msg = json.loads(self._recv())
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise CDPError(f"{method}: {msg['error'].get('message')}")
                return msg.get("result", {})

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise CDPError(f"page script error: {result['exceptionDetails'].get('text')}")
        return result.get("result", {}).get("value")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class TargetWatcher:
    """The browser's page targets (id, url, title), kept current by DevTools' Target events
    on a browser-level websocket read by a thread: the daemon learns of a tab a page opened
    without asking /json/list over HTTP on every step."""

    def __init__(self, port: int):
        version = http_json(port, "/json/version")
        self.session = Session(version["webSocketDebuggerUrl"])
        self.pages: dict[str, dict] = {}  # in the order the browser reported them (creation order)
        self.destroyed: set[str] = set()
        self.lock = threading.Lock()
        self.alive = True
        self.session._send(json.dumps({"id": 1, "method": "Target.setDiscoverTargets", "params": {"discover": True}}))
        self.session.sock.settimeout(None)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                msg = json.loads(self.session._recv())
                method, info = msg.get("method"), msg.get("params", {}).get("targetInfo")
                with self.lock:
                    if method in ("Target.targetCreated", "Target.targetInfoChanged") and info:
                        if info.get("type") == "page":
                            self.pages.setdefault(info["targetId"], {}).update(info)
                    elif method == "Target.targetDestroyed":
                        self.pages.pop(msg["params"].get("targetId"), None)
                        self.destroyed.add(msg["params"].get("targetId"))
        except (CDPError, OSError, ValueError):
            self.alive = False

    def targets(self) -> list[dict]:
        """Like /json/list's pages: newest first, each with "id"."""
        with self.lock:
            return [{"id": tid, **info} for tid, info in reversed(self.pages.items())]

    def close(self) -> None:
        self.alive = False
        self.session.close()
