"""The env's handle on one sandbox's GUI daemon (sandbox/gui_daemon.py).

Start: the daemon's files are uploaded and it is run with the agent's own Python, like
the Claw service. Requests then go straight to its unix socket when the host can reach
it by path (the local backend: the sandbox's working directory is a host folder; a nonce
from the daemon's hello proves it is this sandbox's daemon), otherwise through a relay
command run by the sandbox's agent (any backend), the screenshot downloaded as a file.
On the direct socket the daemon passes a shared memory file (memfd, SCM_RIGHTS) with its
hello: screenshots land there, and only a short JSON line crosses the socket per step.
"""

from __future__ import annotations

import asyncio
import json
import mmap
import os
import secrets
import socket
from pathlib import Path

import numpy as np

from orchard_gym.client import AsyncSandboxInstance

from ..claw.deploy import agent_python

SANDBOX_DIR = Path(__file__).parent / "sandbox"
FILES = ["gui_daemon.py", "gui_server.py", "procwatch.py", "xgrab.py", "xinput.py", "cdp.py", "gui_relay.py", "page_input.py"]
STATE_DIR = ".gui"


class DisplayError(RuntimeError):
    """The GUI stack did not start, or its daemon is gone."""


class TaskTabGone(DisplayError):
    """The tab the task was set up in was closed (by the policy: the task's page is gone)."""


def to_rgb(frame, width: int, height: int) -> np.ndarray:
    """Xvfb's BGRX pixels (bytes or a buffer) as a new (H, W, 3) uint8 RGB array.
    One channel at a time: numpy copies a reversed-stride (2::-1) view about 20x slower."""
    bgrx = np.frombuffer(frame, dtype=np.uint8, count=width * height * 4).reshape(height, width, 4)
    rgb = np.empty((height, width, 3), np.uint8)
    rgb[..., 0] = bgrx[..., 2]
    rgb[..., 1] = bgrx[..., 1]
    rgb[..., 2] = bgrx[..., 0]
    return rgb


class Display:
    def __init__(self, sandbox: AsyncSandboxInstance, home: str, python: list[str], hello: dict):
        self.sandbox, self.home, self.python, self.hello = sandbox, home, python, hello
        self.width, self.height = hello["width"], hello["height"]
        self._sock: socket.socket | None = None
        self._file = None
        self._frames: mmap.mmap | None = None  # the daemon's shared frame buffer (direct socket)
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
            try:  # what the daemon and its programs said: which start-up step it was in
                log = (await sandbox.download_content(f"{base}/{STATE_DIR}/programs.log"))[-1500:].decode(errors="replace")
            except Exception:  # the error below is the one that matters
                log = ""
            hello["error"] = f"{hello.get('error')}\n--- programs.log (end) ---\n{log}" if log else hello.get("error")
            raise DisplayError(f"the GUI stack did not start (exit {r.exit_code}): {hello.get('error')}")
        display = cls(sandbox, home, python, {**hello, "nonce": config["nonce"]})
        await display._connect_direct(sandbox.record.backend == "local")
        return display

    async def _connect_direct(self, local: bool) -> None:
        if not local or not os.path.exists(self.socket_path):
            return
        sock = socket.socket(socket.AF_UNIX)
        fds: list[int] = []
        try:
            sock.connect(self.socket_path)
            sock.sendall(b'{"op": "hello", "frame_fd": true}\n')
            line = b""
            while not line.endswith(b"\n"):  # the answer is one short line; the fd rides with it
                data, more, _, _ = socket.recv_fds(sock, 65536, 1)
                if not data:
                    raise OSError("the GUI daemon closed the socket")
                line, fds = line + data, fds + list(more)
            answer = json.loads(line)
        except (OSError, ValueError):
            for fd in fds:
                os.close(fd)
            sock.close()
            return
        if answer.get("nonce") != self.hello["nonce"]:
            for fd in fds:
                os.close(fd)
            sock.close()  # not this sandbox's daemon: use the relay
            return
        if answer.get("frame_fd") and fds:
            try:
                self._frames = mmap.mmap(fds[0], answer["frame_bytes"], prot=mmap.PROT_READ)
            except (OSError, ValueError):
                self._frames = None  # frames then come over the socket
            finally:
                for fd in fds:
                    os.close(fd)
        self._sock, self._file = sock, sock.makefile("rb")

    @property
    def direct(self) -> bool:
        return self._sock is not None

    @property
    def shared_frames(self) -> bool:
        return self._frames is not None

    async def request(self, req: dict, timeout: float = 120) -> tuple[dict, np.ndarray | None]:
        """One request; the answer's screenshot (if any) as a new RGB array."""
        async with self._lock:
            if self._sock is not None:
                return await asyncio.wait_for(asyncio.to_thread(self._direct, req), timeout)
            return await self._relay(req, timeout)

    def _direct(self, req: dict) -> tuple[dict, np.ndarray | None]:
        try:
            self._sock.sendall(json.dumps(req).encode() + b"\n")
            line = self._file.readline()
            if not line:
                raise DisplayError("the GUI daemon closed its socket (it died)")
            head = json.loads(line)
            if head.get("frame_fd_bytes"):  # in the shared buffer: convert it before the next request
                return head, to_rgb(self._frames, head["width"], head["height"])
            frame = self._file.read(head["frame"]) if head.get("frame") else b""
        except OSError as e:
            raise DisplayError(f"the GUI daemon is unreachable: {e}") from None
        return head, (to_rgb(frame, head["width"], head["height"]) if frame else None)

    async def _relay(self, req: dict, timeout: float) -> tuple[dict, bytes]:
        frame_path = f"{self.home}/frame.bin"
        r = await self.sandbox.exec([*self.python, f"{self.home}/gui_relay.py", self.socket_path, frame_path],
                                    stdin=json.dumps(req), timeout=timeout)
        try:
            head = json.loads(r.stdout)
        except ValueError:
            raise DisplayError(f"the GUI daemon did not answer (exit {r.exit_code}): {r.stderr[-500:]}") from None
        if not head.get("frame"):
            return head, None
        frame = await self.sandbox.download_content(frame_path)
        return head, to_rgb(frame, head["width"], head["height"])

    async def act(self, action: dict, settle="frame") -> tuple[dict, np.ndarray | None]:
        return await self.request({"op": "act", "action": action, "settle": settle})

    async def shot(self, settle=0) -> tuple[dict, np.ndarray | None]:
        return await self.request({"op": "shot", "settle": settle})

    async def evaluate(self, expression: str, tab: str | None = None):
        """A read-only expression on the active page, or with tab="task" on the task's own tab
        (where the env set the task up, wherever the policy went since)."""
        head, _ = await self.request({"op": "eval", "expression": expression, **({"tab": tab} if tab else {})})
        if head.get("task_tab_gone"):
            raise TaskTabGone(head.get("error", "the task's tab was closed"))
        if not head.get("ok"):
            raise DisplayError(head.get("error", "the page could not be read"))
        return head["value"]

    async def load(self, config: dict) -> dict:
        head, _ = await self.request({"op": "load", **config})
        if not head.get("ok"):
            raise DisplayError(head.get("error", "the task page did not load"))
        return head

    def close(self) -> None:
        if self._frames is not None:
            self._frames.close()
            self._frames = None
        if self._sock is not None:
            self._sock.close()
            self._sock = self._file = None
