"""The pre-forked agent: local sandboxes forked from one warm interpreter instead of
`bwrap ... python3 -I -S -B AGENT` each (the interpreter start and the agent's imports
were most of a local sandbox's CPU; see docs/backends.md, "The zygote").

`Zygote` starts `zygote_server.py` once per backend (lazily, on the first create), talks
to it over a private socketpair, and restarts it when it died. `choose()` says whether a
backend uses it: `spawner="auto"` (the default, or $ORCHARD_LOCAL_SPAWNER) uses it where it
can run (bubblewrap isolation asked for, root, Linux with mount_setattr), `"zygote"`
insists, `"bwrap"` keeps the old path. The namespaces, mounts and capabilities a zygote
child sets up match the bubblewrap command line in local.py (zygote_ns.py says how).
"""

from __future__ import annotations

import array
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import procs

log = logging.getLogger(__name__)
SERVER = Path(__file__).with_name("zygote_server.py")
START_TIMEOUT = 30.0  # seconds for the zygote's imports on a loaded host
SPAWN_TIMEOUT = 30.0
SPAWN_THREADS = 32  # creates waiting on the zygote at once (they block on a socket, not the CPU)


class ZygoteError(OSError):
    """The zygote could not start a sandbox (the message says why)."""


def unavailable_reason(spawner: str, bwrap: str | None) -> str | None:
    """Why a backend with this `spawner` setting cannot use the zygote (None: it can)."""
    if spawner == "bwrap":
        return "spawner='bwrap' in the backend config"
    if not bwrap:
        return "no bubblewrap isolation (the zygote replaces bwrap, not a plain process)"
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if os.geteuid() != 0:
        return "not root (the zygote makes namespaces and mounts itself)"
    return None


class Zygote:
    """One zygote process and the socket to it; thread-safe (creates run in threads)."""

    def __init__(self, python: str, agent_dir: str, log_path: Path, kill_on_exit: bool):
        self.python, self.agent_dir, self.log_path, self.kill_on_exit = python, agent_dir, log_path, kill_on_exit
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self.restarts = 0
        self.spawned = 0
        self.executor = ThreadPoolExecutor(SPAWN_THREADS, thread_name_prefix="orchard-zygote")

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [self.python, "-I", "-S", "-B", str(SERVER), "--control-fd", str(theirs.fileno()),
                "--agent", self.agent_dir] + (["--kill-on-exit"] if self.kill_on_exit else [])
        try:
            with open(self.log_path, "ab") as logf:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                        pass_fds=[theirs.fileno()], start_new_session=True, env={"LANG": "C.UTF-8"})
        except OSError:
            mine.close()
            raise
        finally:
            theirs.close()
        mine.settimeout(START_TIMEOUT)
        try:
            ready = mine.recv(16)
        except OSError as e:
            ready = f"{type(e).__name__}: {e}".encode()
        if ready != b"R":
            mine.close()
            proc.kill()
            proc.wait()
            raise ZygoteError(f"the zygote did not start ({ready!r}){procs.log_tail(self.log_path, 'zygote')}")
        mine.settimeout(None)
        self._proc, self._control = proc, mine

    def _running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _ensure(self) -> socket.socket:
        if not self._running():
            if self._proc is not None:
                self.restarts += 1
                log.warning("the local backend's zygote (pid %d) exited with %s; starting a new one",
                            self._proc.pid, self._proc.returncode)
                self._drop()
            self._start()
        return self._control

    def _drop(self) -> None:
        if self._control is not None:
            self._control.close()
        self._control = None
        if self._proc is not None:
            self._proc.poll()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._running() else None

    def close(self) -> None:
        """Close the control socket: the zygote exits (killing its sandboxes if kill_on_exit)."""
        self.executor.shutdown(wait=False)
        with self._lock:
            proc = self._proc
            self._drop()
            self._proc = None
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def describe(self) -> dict:
        return {"pid": self.pid, "spawned": self.spawned, "restarts": self.restarts}

    # ------------------------------------------------------------------ spawning
    def _open_request(self) -> socket.socket:
        """A fresh socket to a zygote child (the zygote forks on it), restarting a dead zygote once."""
        with self._lock:
            for attempt in (0, 1):
                control = self._ensure()
                mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                try:
                    control.sendmsg([b"S"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno()]))])
                    return mine
                except OSError:  # it died between the check and the send
                    mine.close()
                    if attempt:
                        raise
                    if self._proc is not None:
                        self._proc.wait(timeout=5)
                finally:
                    theirs.close()
        raise AssertionError("unreachable")

    def spawn(self, request: dict, fds: list[int]) -> int:
        """Start one sandbox; its pid (pid 1 of its PID namespace, host numbering). Returns once
        the namespaces exist; the mounts and the agent follow (the backend's ready-wait)."""
        conn = self._open_request()
        try:
            conn.settimeout(SPAWN_TIMEOUT)
            conn.sendmsg([json.dumps(request).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            answer: dict = {}
            deadline = time.monotonic() + SPAWN_TIMEOUT
            while "error" not in answer and "pid" not in answer:
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                data = conn.recv(64 * 1024)
                if not data:
                    break
                answer.update(json.loads(data))
        except (OSError, ValueError) as e:
            raise ZygoteError(f"the zygote did not answer: {type(e).__name__}: {e}") from e
        finally:
            conn.close()
        if "error" in answer:
            raise ZygoteError(f"the zygote refused or failed the sandbox: {answer['error']}")
        if "pid" not in answer:
            raise ZygoteError(f"the zygote's child exited before it started the sandbox ({answer})")
        self.spawned += 1
        return int(answer["pid"])


def zygote_request(meta: dict, spec_env: dict, agent_args: list[str], view: list[list[str]],
            cgroup_fds: int, job_cgroup_index: int | None) -> dict:
    """What zygote_server.check_request() accepts for one sandbox (`view`: local_view.plan())."""
    return {"v": 1, "sandbox_id": meta["sandbox_id"], "workdir": meta["workdir"],
            "workdir_at": meta.get("sandbox_workdir", meta["workdir"]),  # a fork: at its snapshot's path
            "rundir": str(Path(meta["socket"]).parent), "view": view, "network": meta["network"],
            "env": spec_env, "agent_args": agent_args, "cgroup_fds": cgroup_fds,
            "job_cgroup_index": job_cgroup_index}


class ZygoteChild:
    """A zygote-made sandbox's process as the backend tracks it (a Popen's poll/wait; the
    zygote, not this process, is its parent and reaps it)."""

    def __init__(self, pid: int):
        self._procs, self.pid = procs, pid
        self.ident = procs.identity(pid)

    def poll(self) -> int | None:
        return None if self._procs.alive(self.ident) else 0

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("zygote child", timeout)
            time.sleep(0.005)
        return 0
