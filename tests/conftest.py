"""Shared fixtures. Everything here starts real components: agents, sandboxes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
AGENT_PY = REPO / "orchard_gym" / "agent.py"
HAS_BWRAP = shutil.which("bwrap") is not None


def marked_pids(needle: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds `needle`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle.encode() in env and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


class AgentProcess:
    """A real agent process on a unix socket, with an httpx client for it."""

    def __init__(self, tmp: Path, token: str = "secret-token", *args: str):
        self.socket = str(tmp / "agent.sock")
        self.cwd = tmp / "work"
        self.cwd.mkdir()
        self.token = token
        env = {**os.environ, "ORCHARD_AGENT_TOKEN": token}
        self.proc = subprocess.Popen(
            [sys.executable, str(AGENT_PY), "--socket", self.socket, "--cwd", str(self.cwd), *args], env=env
        )
        transport = httpx.HTTPTransport(uds=self.socket)
        self.http = httpx.Client(transport=transport, base_url="http://agent", timeout=30,
                                 headers={"Authorization": f"Bearer {token}"})
        self.anon = httpx.Client(transport=httpx.HTTPTransport(uds=self.socket), base_url="http://agent", timeout=30)
        assert wait_until(self._up, 10), "agent did not start"

    def _up(self) -> bool:
        try:
            return self.anon.get("/health").status_code == 200
        except httpx.TransportError:
            return False

    def exec(self, **body) -> dict:
        resp = self.http.post("/exec", json=body)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def raw(self, data: bytes) -> bytes:
        """Send raw bytes on a fresh connection and return what comes back."""
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(self.socket)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
        s.close()
        return b"".join(chunks)

    def close(self) -> None:
        self.http.close()
        self.anon.close()
        self.proc.terminate()
        self.proc.wait(5)


@pytest.fixture
def agent(tmp_path):
    a = AgentProcess(tmp_path, "secret-token", "--max-output", "100000")
    yield a
    a.close()


@pytest.fixture
def local_root(tmp_path_factory):
    # short path: unix socket paths are limited to 108 bytes
    root = Path(f"/tmp/og-test-{os.getpid()}-{time.monotonic_ns() % 10**8}")
    root.mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


def local_configs():
    configs = [pytest.param({"type": "local", "isolation": "none"}, id="local-plain")]
    if HAS_BWRAP:
        configs.insert(0, pytest.param({"type": "local", "isolation": "bwrap"}, id="local-bwrap"))
    return configs


# --------------------------------------------------------------------------- conformance
# Each backend the conformance suite runs against: its config, the image to use, and the
# address at which a sandbox with network reaches a server on this machine.
def conformance_params():
    params = []
    if HAS_BWRAP:
        params.append(pytest.param({"config": {"type": "local", "isolation": "bwrap"}, "image": None,
                                    "host_address": "127.0.0.1"}, id="local-bwrap"))
    params.append(pytest.param({"config": {"type": "local", "isolation": "none"}, "image": None,
                                "host_address": "127.0.0.1", "no_netns": True}, id="local-plain"))
    return params


@pytest.fixture(params=conformance_params())
def backend_case(request, local_root):
    case = dict(request.param)
    config = dict(case["config"])
    if config["type"] == "local":
        config["root"] = str(local_root)
    case["config"] = config
    return case


@pytest.fixture
def client(backend_case):
    from orchard_gym import SandboxClient

    c = SandboxClient(backend_case["config"])
    yield c
    c.close()


@pytest.fixture
def sandbox(client, backend_case):
    box = client.create_sandbox(image=backend_case["image"])
    yield box
    try:
        box.delete()
    except Exception:
        pass
