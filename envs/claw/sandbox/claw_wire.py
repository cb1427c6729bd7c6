"""Talking to the Claw service: one JSON request per unix-socket connection (stdlib only)."""

from __future__ import annotations

import json
import os
import socket

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SOCKET = os.path.join(HERE, "claw.sock")


def socket_path() -> str:
    return os.environ.get("CLAW_SOCKET") or DEFAULT_SOCKET


def encode(obj) -> bytes:
    # surrogateescape: bytes that were not UTF-8 (e.g. in argv) reach the service as they
    # were, and the service answers that they are not UTF-8
    return json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogateescape")


def request_raw(data: bytes, path: str | None = None, timeout: float = 60.0) -> dict:
    """Send request bytes, return the answer; a service that cannot be reached is an error answer."""
    path = path or socket_path()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(path)
            conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
            chunks = []
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError as e:
        return {"ok": False, "error": f"the claw service is unreachable at {path}: {e}"}
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        return {"ok": False, "error": "the claw service sent an answer that is not JSON"}


def request(obj, path: str | None = None, timeout: float = 60.0) -> dict:
    return request_raw(encode(obj), path, timeout)


def call(tool: str, args, door: str, path: str | None = None) -> dict:
    return request({"op": "call", "tool": tool, "args": args, "door": door}, path)
