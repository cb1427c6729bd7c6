"""Real orchestrators and a real Redis for the tests: subprocesses on free loopback ports."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
API_KEY = "test-key-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` itself holds a listening TCP socket on `port` (any address).
    `free_port()` only finds a port that was free a moment ago: under parallel workers another
    server can take it first, and then a health check or PING answered on that port would be
    that other server's answer, not ours."""
    inodes = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()  # sl local_address rem_address st ... inode
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


def short_root(tag: str) -> Path:
    """A sandbox root with a short path (unix socket paths are limited to 108 bytes)."""
    root = Path(f"/tmp/og-{tag}-{os.getpid()}-{time.monotonic_ns() % 10**8}")
    root.mkdir(parents=True)
    return root


def need_redis_server() -> None:
    """Skip without redis-py or redis-server, unless $ORCHARD_REQUIRE names redis (CI installs it): then fail."""
    from components import require, require_module

    require_module("redis", "redis")
    require("redis", None if shutil.which("redis-server") else "redis-server is not installed (bash scripts/setup_system.sh)")


class RedisServer:
    """redis-server in a temp dir, no persistence. `args`: more redis-server options (e.g.
    `["--requirepass", pw]` or `--user` ACL rules); `unixsocket`: also listen there."""

    def __init__(self, workdir: Path, args: list[str] = (), unixsocket: Path | None = None):
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (bash scripts/setup_system.sh)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.unixsocket = unixsocket
        extra = ["--unixsocket", str(unixsocket), "--unixsocketperm", "700"] if unixsocket else []
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir), "--protected-mode", "no", *extra, *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:
            try:
                if not listens(self.proc.pid, self.port):  # not up yet, or the port is another's
                    raise OSError
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    # a Redis that wants a password answers -NOAUTH: it is up all the same
                    if s.recv(16).startswith((b"+PONG", b"-NOAUTH")):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class PortTaken(RuntimeError):
    """The orchestrator could not bind its port: something else took it."""


class Orchestrator:
    """`orchard serve` as a real uvicorn subprocess on a free loopback port."""

    def __init__(self, root: Path, *, api_key: str | None = API_KEY, log_dir: Path | None = None,
                 port: int | None = None, **settings):
        self.root, self.api_key = Path(root), api_key
        self.backend_config = settings.pop("backend_config", {})
        self.settings = settings  # ServiceSettings fields, e.g. sandbox_ttl=2 -> ORCHARD_SANDBOX_TTL=2
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir = Path(log_dir or root)
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        try:
            self.start()
        except PortTaken:
            if port:
                raise
            # free_port()'s port was taken before uvicorn bound it (another worker's server): a fresh one
            self.port, self.starts = free_port(), 0
            self.url = f"http://127.0.0.1:{self.port}"
            self.start()

    def env(self) -> dict[str, str]:
        # keep a private injector image (PREAMBLE: one per branch) for docker/kubernetes backends
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_") or k == "ORCHARD_INJECTOR_IMAGE"}
        env["ORCHARD_API_KEYS"] = self.api_key or ""
        local = self.settings.get("backend", "local") == "local"  # only the local backend has a root
        config = {**({"root": str(self.root)} if local else {}), **self.backend_config}
        if config.get("root", "") is None:  # backend_config={"root": None}: the serve default root
            del config["root"]
        env["ORCHARD_BACKEND_CONFIG"] = json.dumps(config)
        for key, value in self.settings.items():
            env[f"ORCHARD_{key.upper()}"] = str(value)
        return env

    def start(self) -> None:
        self.starts += 1
        self.log = self.log_dir / f"orchestrator-{self.port}-{self.starts}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "orchard_gym.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
                env=self.env(), cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 90  # a loaded machine (parallel workers) can take 20 s to import and start
        while True:
            try:  # our own process's answer (not another server's that took the port first)
                if listens(self.proc.pid, self.port) and httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = self.log.read_text()[-3000:]
                raise (PortTaken if "address already in use" in log else RuntimeError)(
                    f"orchestrator did not start:\n{log}")
            time.sleep(0.05)

    @property
    def headers(self) -> dict[str, str]:
        return {"X-API-Key": self.api_key} if self.api_key else {}

    def http(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=30, **kw)

    def client(self, **kw):
        from orchard_gym import SandboxClient

        return SandboxClient(base_url=self.url, api_key=self.api_key, **kw)

    def reconcile_passes(self) -> int:
        """How many reconciliation passes this replica has made as the leader (from its /metrics)."""
        with self.http() as http:
            text = http.get("/metrics").text
        return int(float(re.search(r"^orchard_reconcile_seconds_count (\S+)$", text, re.M).group(1)))

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob(f"orchestrator-{self.port}-*.log")))


def remove_all_sandboxes(root: Path) -> list[str]:
    """Delete every sandbox under `root` (orchestrator sandboxes outlive the orchestrator)."""
    import asyncio

    from orchard_gym.backends.config import LocalBackendConfig
    from orchard_gym.backends.local import LocalBackend

    if not Path(root).exists():
        return []
    backend = LocalBackend(LocalBackendConfig(root=root, die_with_client=False))

    async def run():
        records = await backend.list()
        for r in records:
            await backend.delete(r.sandbox_id)
        return [r.sandbox_id for r in records]

    return asyncio.run(run())
