"""The env's handle on one sandbox's GUI daemon (sandbox/gui_daemon.py).

Start: the daemon's files are uploaded and it is run with the agent's own Python, like
the Claw service. Requests then go straight to its unix socket when the host can reach
it by path (the local backend: the sandbox's working directory is a host folder; a nonce
from the daemon's hello proves it is this sandbox's daemon), otherwise through a relay
command run by the sandbox's agent (any backend), the screenshot downloaded as a file.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
from pathlib import Path

import numpy as np

from orchard_gym.client import AsyncSandboxInstance

from ..claw.deploy import agent_python

SANDBOX_DIR = Path(__file__).parent / "sandbox"
FILES = ["gui_daemon.py", "xgrab.py", "xinput.py", "cdp.py", "gui_relay.py"]
STATE_DIR = ".gui"


class DisplayError(RuntimeError):
    """The GUI stack did not start, or its daemon is gone."""


def to_rgb(frame: bytes, width: int, height: int) -> np.ndarray:
    """Xvfb's BGRX pixels as an (H, W, 3) uint8 RGB array."""
    bgrx = np.frombuffer(frame, dtype=np.uint8).reshape(height, width, 4)
    return np.ascontiguousarray(bgrx[:, :, 2::-1])


class Display:
    def __init__(self, sandbox: AsyncSandboxInstance, home: str, python: list[str], hello: dict):
        self.sandbox, self.home, self.python, self.hello = sandbox, home, python, hello
        self.width, self.height = hello["width"], hello["height"]
        self._sock: socket.socket | None = None
        self._file = None
        self._lock = asyncio.Lock()

    @property
    def socket_path(self) -> str:
        return f"{self.home}/gui.sock"

    @classmethod
    async def start(cls, sandbox: AsyncSandboxInstance, config: dict, timeout: float = 120) -> Display:
        base = sandbox.workdir or "/workspace"
        home = f"{base}/{STATE_DIR}"
        python = await agent_python(sandbox)
        for name in FILES:
            await sandbox.upload_content((SANDBOX_DIR / name).read_bytes(), f"{home}/{name}")
        config = {**config, "home": base, "nonce": secrets.token_hex(16)}
        r = await sandbox.exec([*python, f"{home}/gui_daemon.py", "--socket", f"{home}/gui.sock"],
                               stdin=json.dumps(config) + "\n", timeout=timeout)
        try:
            hello = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            hello = {"ok": False, "error": (r.stderr or r.stdout)[-2000:]}
        if not hello.get("ok"):
            raise DisplayError(f"the GUI stack did not start (exit {r.exit_code}): {hello.get('error')}")
        display = cls(sandbox, home, python, {**hello, "nonce": config["nonce"]})
        await display._connect_direct(sandbox.record.backend == "local")
        return display

    async def _connect_direct(self, local: bool) -> None:
        if not local or not os.path.exists(self.socket_path):
            return
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.connect(self.socket_path)
            f = sock.makefile("rb")
            sock.sendall(b'{"op": "hello"}\n')
            answer = json.loads(f.readline())
        except (OSError, ValueError):
            sock.close()
            return
        if answer.get("nonce") != self.hello["nonce"]:
            sock.close()  # not this sandbox's daemon: use the relay
            return
        self._sock, self._file = sock, f

    @property
    def direct(self) -> bool:
        return self._sock is not None

    async def request(self, req: dict, timeout: float = 120) -> tuple[dict, bytes]:
        async with self._lock:
            if self._sock is not None:
                return await asyncio.wait_for(asyncio.to_thread(self._direct, req), timeout)
            return await self._relay(req, timeout)

    def _direct(self, req: dict) -> tuple[dict, bytes]:
        try:
            self._sock.sendall(json.dumps(req).encode() + b"\n")
            line = self._file.readline()
            if not line:
                raise DisplayError("the GUI daemon closed its socket (it died)")
            head = json.loads(line)
            frame = self._file.read(head["frame"]) if head.get("frame") else b""
        except OSError as e:
            raise DisplayError(f"the GUI daemon is unreachable: {e}") from None
        return head, frame

    async def _relay(self, req: dict, timeout: float) -> tuple[dict, bytes]:
        frame_path = f"{self.home}/frame.bin"
        r = await self.sandbox.exec([*self.python, f"{self.home}/gui_relay.py", self.socket_path, frame_path],
                                    stdin=json.dumps(req), timeout=timeout)
        try:
            head = json.loads(r.stdout)
        except ValueError:
            raise DisplayError(f"the GUI daemon did not answer (exit {r.exit_code}): {r.stderr[-500:]}") from None
        frame = await self.sandbox.download_content(frame_path) if head.get("frame") else b""
        return head, frame

    async def act(self, action: dict, settle="frame") -> tuple[dict, np.ndarray | None]:
        head, frame = await self.request({"op": "act", "action": action, "settle": settle})
        return head, (to_rgb(frame, head["width"], head["height"]) if frame else None)

    async def shot(self) -> tuple[dict, np.ndarray]:
        head, frame = await self.request({"op": "shot"})
        return head, to_rgb(frame, head["width"], head["height"])

    async def evaluate(self, expression: str):
        head, _ = await self.request({"op": "eval", "expression": expression})
        if not head.get("ok"):
            raise DisplayError(head.get("error", "the page could not be read"))
        return head["value"]

    async def load(self, config: dict) -> dict:
        head, _ = await self.request({"op": "load", **config})
        if not head.get("ok"):
            raise DisplayError(head.get("error", "the task page did not load"))
        return head

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = self._file = None
