#!/usr/bin/env python3
"""The execution agent that runs inside every sandbox.

It is injected into images we do not control, so it uses the Python standard
library only and lives in this one file. It serves a small JSON-over-HTTP API on a
TCP port or a unix socket:

    GET  /health                      no auth: {"status", "version", "uptime"}
    POST /exec                        run a command, return its output
    POST /exec/stream                 the same, streamed as NDJSON chunks
    POST /files                       upload {path, content (base64), mode}
    PUT  /files?path=P&mode=M         upload raw bytes
    GET  /files?path=P                download raw bytes
    GET  /files/list?path=P           list a directory
    POST /patch                       apply a unified diff with git (or patch)
    GET  /jobs                        the running jobs' ids
    POST /jobs/ID/cancel              kill a running job (its /exec answers cancelled)

Every route but /health needs `Authorization: Bearer <token>`. The agent holds only
the token's SHA-256 (`--token-sha256`), so nothing in the sandbox can reveal the token.
Bad requests get a 4xx JSON error; the agent never crashes on them. A client that hangs
up on /exec gets its job killed; slow or stalled clients are cut off (`--read-timeout`).
File routes serve regular files only, streamed, up to `--max-file-size`, and only under
the workdir (or a `--files-root`): see docs/backends.md, "File paths".

Timeouts kill the whole process tree of a command, including descendants that
called setsid or double-forked: each command's environment carries a unique
ORCHARD_JOB marker, and on timeout we kill its process group and then every
process whose environment holds the marker (the same idea as a cgroup, without
needing one). The agent also makes itself a child subreaper so that orphaned
descendants stay under it (and get reaped) rather than escaping to the host's init.
Where the local backend passes a cgroup (--job-cgroup-fd), each command also gets its own
cgroup, killed whole (JobCgroups): `env -i` drops the marker, not the cgroup.

Run `python3 agent.py --help` for options.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import stat
import selectors
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
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

VERSION = "0.1.0"
DEFAULT_MAX_OUTPUT = 4 * 1024 * 1024  # bytes per stream
MAX_BODY = 512 * 1024 * 1024  # largest request body we accept
DEFAULT_MAX_FILE = 100 * 1024 * 1024  # largest file GET /files serves
MAX_TIMEOUT = 7 * 86400  # seconds; as the SDK's ExecRequest
MIN_RATE = 64 * 1024  # bytes/s a client must at least move while sending or receiving a body
CHUNK = 1 << 20  # bytes per read/write when streaming files
JOB_MARKER = "ORCHARD_JOB"
KILL_GRACE = 0.2  # seconds to let pipes drain after the main process exits


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


class BadRequest(Exception):
    """A client error: answered with a 4xx and a message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


# --------------------------------------------------------------------------- processes


def _prctl_setup() -> None:
    """Keep orphaned descendants under this process, and make it non-dumpable so that no
    process of the sandbox without CAP_SYS_PTRACE can read our /proc/PID/environ, mem or
    fds (commands are exec'd, which makes them dumpable again). Linux only, best effort."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except Exception:
        pass


_tracked_pids: set[int] = set()  # pids owned by a Popen object: never reaped by us
_tracked_lock = threading.Lock()


def _children() -> set[int]:
    """Our direct children, from /proc/self/task/*/children (cheap, Linux only)."""
    kids: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                kids.update(int(p) for p in f.read().split())
    except OSError:
        pass
    return kids


def _reap_orphans() -> None:
    """Reap zombie orphans re-parented to us without stealing Popen's children.

    Popen's children are registered under _tracked_lock in the same critical section
    that forks them, so none can be mistaken for an orphan here.
    """
    with _tracked_lock:
        for pid in _children() - _tracked_pids:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _reaper_loop() -> None:
    while True:
        time.sleep(1.0)
        _reap_orphans()
        if JOB_CGROUPS is not None:
            JOB_CGROUPS.sweep()


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def kill_marked(needle: str) -> None:
    """SIGKILL every process (but us) whose environment holds `needle`, e.g. ORCHARD_JOB=x."""
    want, me = needle.encode(), os.getpid()
    # A forking loop can spawn while we kill; sweep until a pass finds nothing.
    for _ in range(50):
        found = [p for p in _pids() if p != me and _has_marker(p, want)]
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


class JobCgroups:
    """A cgroup per command under the sandbox's cgroup (local backend, --job-cgroup-fd):
    a timeout freezes then kills the whole cgroup, so `env -i setsid cmd &` or a double
    fork cannot outlive it. The directory comes as an fd opened by the host; we never
    reach the cgroupfs by path (it is read-only inside bubblewrap)."""

    def __init__(self, dir_fd: int):
        self.fd = dir_fd
        self.v2 = _exists("cgroup.freeze", dir_fd)
        self.left: set[str] = set()  # cgroups of finished jobs whose background processes live on
        try:  # no same-uid command may reopen our fds through /proc/<agent>/fd
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
        except Exception:
            pass

    def prepare(self, marker: str, argv: list[str]):
        """A fresh job cgroup, and how the child joins it before the command runs:
        (open cgroup.procs fd, argv, pass_fds, preexec_fn). A `bash -c` command joins
        itself (a prefix writes "0" to the inherited fd, then closes it): a preexec_fn
        would make Popen fork instead of vfork, ~10 ms per command on a VM."""
        name = f"job-{marker}"
        os.mkdir(name, dir_fd=self.fd)
        procs = os.open(f"{name}/cgroup.procs", os.O_WRONLY, dir_fd=self.fd)
        if len(argv) == 3 and os.path.basename(argv[0]) == "bash" and argv[1] in ("-c", "-lc"):
            joined = f"printf 0 >&{procs} || exit 125; exec {procs}>&-; {argv[2]}"
            return procs, [argv[0], argv[1], joined], (procs,), None
        return procs, argv, (), lambda: os.write(procs, b"0")

    def kill(self, marker: str) -> None:
        name = f"job-{marker}"
        if not _exists(name, self.fd):
            return
        if self.v2 and _exists(f"{name}/cgroup.kill", self.fd):
            _write_at(self.fd, f"{name}/cgroup.kill", "1")
        else:
            state, frozen, thawed = ("cgroup.freeze", "1", "0") if self.v2 else ("freezer.state", "FROZEN", "THAWED")
            try:
                _write_at(self.fd, f"{name}/{state}", frozen)
                for _ in range(500):  # v1 reads FREEZING until every task stopped
                    if self.v2 or _read_at(self.fd, f"{name}/{state}").strip() != "FREEZING":
                        break
                    time.sleep(0.002)
                for pid in self._pids(name):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            finally:  # a killed task in a frozen v1 cgroup stays in D state until thawed
                _write_at(self.fd, f"{name}/{state}", thawed)
        for _ in range(500):
            if not self._pids(name):
                break
            time.sleep(0.002)
        self.release(marker)

    def release(self, marker: str) -> None:
        """Remove the job's cgroup; while processes live in it, keep it for later."""
        name = f"job-{marker}"
        try:
            os.rmdir(name, dir_fd=self.fd)
            self.left.discard(name)
        except FileNotFoundError:
            self.left.discard(name)
        except OSError:
            self.left.add(name)

    def sweep(self) -> None:
        for name in list(self.left):
            self.release(name[4:])

    def kill_all(self) -> None:
        for name in os.listdir(self.fd):
            if name.startswith("job-"):
                self.kill(name[4:])

    def _pids(self, name: str) -> list[int]:
        try:
            return [int(p) for p in _read_at(self.fd, f"{name}/cgroup.procs").split()]
        except OSError:
            return []


def _exists(path: str, dir_fd: int) -> bool:
    try:
        os.stat(path, dir_fd=dir_fd)
        return True
    except OSError:
        return False


def _read_at(dir_fd: int, path: str) -> str:
    fd = os.open(path, os.O_RDONLY, dir_fd=dir_fd)
    try:
        return os.read(fd, 1 << 20).decode()
    finally:
        os.close(fd)


def _write_at(dir_fd: int, path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY, dir_fd=dir_fd)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


JOB_CGROUPS: JobCgroups | None = None  # set by main() when the backend passes a cgroup


def kill_job(proc: subprocess.Popen, marker: str) -> None:
    """Kill the command's cgroup (if any), process group and every process carrying its marker."""
    if JOB_CGROUPS is not None:
        try:
            JOB_CGROUPS.kill(marker)
        except OSError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    kill_marked(f"{JOB_MARKER}={marker}")


class Runner:
    """Builds the argv of a command and runs it with a timeout and output caps."""

    def __init__(self, default_cwd: str, max_output: int):
        self.default_cwd = default_cwd
        self.max_output = max_output
        self.shell = shutil.which("bash") or shutil.which("sh") or "/bin/sh"
        self.active: dict[str, tuple[subprocess.Popen, str]] = {}  # job id -> (process, marker)
        self.cancelled: set[str] = set()  # job ids killed by a cancel, until their answer is made
        self.lock = threading.Lock()

    def argv(self, command, login_shell: bool) -> list[str]:
        if isinstance(command, str):
            if not command.strip():
                raise BadRequest("command is empty")
            return [self.shell, "-lc" if login_shell else "-c", command]
        if isinstance(command, list) and command and all(isinstance(a, str) for a in command):
            return command
        raise BadRequest("command must be a non-empty string or a list of strings")

    def start(self, req: dict) -> tuple[subprocess.Popen, str, float]:
        _only_keys(req, {"command", "cwd", "env", "timeout", "stdin", "login_shell", "max_output", "job_id"})
        if "command" not in req:
            raise BadRequest("missing field: command", 422)
        argv = self.argv(req["command"], bool(_typed(req, "login_shell", bool, False)))
        cwd = os.path.join(self.default_cwd, _typed(req, "cwd", str, None) or "")
        extra_env = _typed(req, "env", dict, None) or {}
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in extra_env.items()):
            raise BadRequest("env must map strings to strings", 422)
        timeout = _number(req, "timeout", 600, positive=True, maximum=MAX_TIMEOUT)
        job_id = _typed(req, "job_id", str, None)
        job_id = os.urandom(8).hex() if job_id is None else job_id
        if not (0 < len(job_id) <= 64 and all(c.isascii() and (c.isalnum() or c in "._-") for c in job_id)):
            raise BadRequest("job_id must be 1-64 characters of letters, digits, '.', '_', '-'", 422)
        stdin = _typed(req, "stdin", str, None)
        if not os.path.isdir(cwd):
            raise BadRequest(f"cwd does not exist: {cwd}", 422)
        with self.lock:
            if job_id in self.active:
                raise BadRequest(f"job {job_id} is already running", 409)
            self.active[job_id] = (None, "")  # reserved: a concurrent start with this id gets the 409
        try:
            return self._spawn(argv, cwd, extra_env, stdin, job_id, float(timeout))
        except BaseException:
            with self.lock:
                self.active.pop(job_id, None)
            raise

    def _spawn(self, argv, cwd, extra_env, stdin, job_id, timeout):
        marker = os.urandom(16).hex()
        env = dict(os.environ)
        env.pop("ORCHARD_AGENT_TOKEN", None)
        env.pop("ORCHARD_AGENT_TOKEN_SHA256", None)
        env.update(extra_env)
        env[JOB_MARKER] = marker
        procs_fd, pass_fds, hook = None, (), None
        if JOB_CGROUPS is not None:
            procs_fd, argv, pass_fds, hook = JOB_CGROUPS.prepare(marker, argv)
        proc = None
        try:
            with _tracked_lock:
                proc = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=hook,
                    pass_fds=pass_fds,
                )
                _tracked_pids.add(proc.pid)
        except FileNotFoundError as e:
            raise BadRequest(f"executable not found: {e.filename}", 422)
        except PermissionError as e:
            raise BadRequest(f"permission denied: {e.filename}", 422)
        finally:
            if procs_fd is not None:
                os.close(procs_fd)
                if proc is None:  # it never started: its cgroup is empty
                    JOB_CGROUPS.release(marker)
        with self.lock:
            self.active[job_id] = (proc, marker)
        if stdin is not None:
            threading.Thread(target=_feed_stdin, args=(proc, stdin.encode()), daemon=True).start()
        return Job(job_id, proc, marker, timeout)

    def cancel(self, job_id: str) -> bool:
        """Kill a running job; its exec answers with cancelled=true. False: no such job."""
        with self.lock:
            proc, marker = self.active.get(job_id, (None, ""))
            if proc is None:
                return False
            self.cancelled.add(job_id)
        kill_job(proc, marker)
        return True

    def stream(self, job: Job, max_output: int, client: socket.socket | None = None):
        """Yield ("stdout"|"stderr", bytes) chunks, then ("exit", result dict).

        Waits on the pipes and on a pidfd (process exit) together, so a command's end is
        seen at once; a background child that keeps the pipes open after the command
        exits is given KILL_GRACE to finish writing, then left alone. `client` is the
        requester's connection: when it hangs up the job is killed at once.
        """
        proc, marker, timeout = job.proc, job.marker, job.timeout
        start = time.monotonic()
        deadline = start + timeout
        sel = selectors.DefaultSelector()
        for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ, name)
        pidfd = _pidfd(proc.pid)
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ, "exit")
        if client is not None:
            sel.register(client, selectors.EVENT_READ, "client")
        sizes = {"stdout": 0, "stderr": 0}
        open_pipes = 2
        truncated = timed_out = client_gone = False
        exited_at = None
        try:
            while True:
                now = time.monotonic()
                if exited_at is None and proc.poll() is not None:
                    exited_at = now
                if exited_at is not None and (open_pipes == 0 or now - exited_at > KILL_GRACE):
                    break
                if now >= deadline:
                    timed_out = True
                    break
                if exited_at is not None:
                    wait = KILL_GRACE - (now - exited_at)
                elif pidfd is not None:
                    wait = deadline - now
                else:
                    wait = min(deadline - now, 0.01)
                for key, _ in sel.select(wait):
                    if key.data == "exit":
                        sel.unregister(pidfd)  # proc.poll() reaps it on the next turn
                        continue
                    if key.data == "client":
                        sel.unregister(client)
                        if _hung_up(client):
                            client_gone = True
                            kill_job(proc, marker)  # nobody waits for the answer any more
                        continue  # else: a pipelined next request, read after this one
                    try:
                        data = os.read(key.fileobj.fileno(), 65536)
                    except BlockingIOError:
                        continue
                    if not data:
                        sel.unregister(key.fileobj)
                        open_pipes -= 1
                        continue
                    name = key.data
                    room = max_output - sizes[name]
                    if len(data) > room:
                        truncated = True
                        data = data[:room]
                    sizes[name] += len(data)
                    if data:
                        yield name, data
            if timed_out:
                kill_job(proc, marker)
            code = proc.wait()
        finally:
            sel.close()
            if pidfd is not None:
                os.close(pidfd)
            for pipe in (proc.stdout, proc.stderr, proc.stdin):
                if pipe:
                    try:
                        pipe.close()
                    except OSError:
                        pass
            with self.lock:
                self.active.pop(job.job_id, None)
                cancelled = job.job_id in self.cancelled or client_gone
                self.cancelled.discard(job.job_id)
            with _tracked_lock:
                _tracked_pids.discard(proc.pid)
            if JOB_CGROUPS is not None:
                JOB_CGROUPS.release(marker)
        yield "exit", {
            "exit_code": -9 if timed_out else code,
            "duration": round(time.monotonic() - start, 6),
            "timed_out": timed_out,
            "truncated": truncated,
            "cancelled": cancelled,
            "job_id": job.job_id,
        }

    def run(self, req: dict, client: socket.socket | None = None) -> dict:
        max_output = _number(req, "max_output", self.max_output, integer=True)
        job = self.start(req)
        out = {"stdout": bytearray(), "stderr": bytearray()}
        result: dict = {}
        for name, data in self.stream(job, max_output, client):
            if name == "exit":
                result = data
            else:
                out[name] += data
        result["stdout"] = out["stdout"].decode("utf-8", "replace")
        result["stderr"] = out["stderr"].decode("utf-8", "replace")
        return result

    def kill_all(self) -> None:
        with self.lock:
            jobs = list(self.active.values())
        for proc, marker in jobs:
            if proc is not None:
                kill_job(proc, marker)
        if JOB_CGROUPS is not None:  # and what finished jobs left running in the background
            JOB_CGROUPS.kill_all()


class Job:
    """A started command: its id (the client's, or ours), process, kill marker and timeout."""

    __slots__ = ("job_id", "proc", "marker", "timeout")

    def __init__(self, job_id: str, proc: subprocess.Popen, marker: str, timeout: float):
        self.job_id, self.proc, self.marker, self.timeout = job_id, proc, marker, timeout


def _hung_up(sock: socket.socket) -> bool:
    """Whether the peer closed its side (readable with no data), without consuming data."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset, or shut down by the read watchdog
        return True


def _pidfd(pid: int) -> int | None:
    """A file descriptor that turns readable when `pid` exits (Linux 5.3+), else None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _feed_stdin(proc: subprocess.Popen, data: bytes) -> None:
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (OSError, ValueError):
        pass


# --------------------------------------------------------------------------- files


def list_dir(path: str) -> dict:
    if not os.path.isdir(path):
        raise BadRequest(f"not a directory: {path}", 404)
    files = []
    with os.scandir(path) as it:
        for entry in sorted(it, key=lambda e: e.name):
            try:
                st = entry.stat(follow_symlinks=False)
                is_dir = entry.is_dir(follow_symlinks=True)
            except OSError:
                continue
            files.append(
                {
                    "name": entry.name,
                    "type": "directory" if is_dir else ("symlink" if entry.is_symlink() else "file"),
                    "size": st.st_size,
                    "modified": st.st_mtime,
                }
            )
    return {"path": path, "files": files}


def write_file(path: str, data, mode: int | None) -> dict:
    """Write bytes, or the chunks an iterable yields, to a temp file renamed over `path` at
    the end (atomic: a reader never sees half a file). Any failure, including a client
    that hangs up mid-body, removes the temp file."""
    if os.path.isdir(path):
        raise BadRequest(f"is a directory: {path}", 409)
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = f"{path}.orchard-{os.urandom(4).hex()}"
    size = 0
    try:
        with open(tmp, "wb") as f:
            for chunk in [data] if isinstance(data, (bytes, bytearray)) else data:
                f.write(chunk)
                size += len(chunk)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return {"success": True, "path": path, "size": size}


def open_regular(path: str, max_size: int) -> tuple[int, int]:
    """Open a regular file for reading: (fd, size). FIFOs, devices, sockets and directories
    are refused before anything is opened (opening a FIFO would block, /dev/zero never ends)."""
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise BadRequest(f"is a directory: {path}", 409)
    if not stat.S_ISREG(st.st_mode):
        raise BadRequest(f"not a regular file ({_file_kind(st.st_mode)}): {path}; use exec to read it", 422)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # NONBLOCK: swapped for a FIFO meanwhile
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadRequest(f"not a regular file ({_file_kind(st.st_mode)}): {path}", 422)
        if st.st_size > max_size:
            raise BadRequest(f"file too large: {path} has {st.st_size} bytes, the limit is {max_size} "
                             f"(agent --max-file-size); read it in parts with exec", 413)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def apply_patch(runner: Runner, patch: str, cwd: str | None, timeout: float) -> dict:
    cwd = cwd or runner.default_cwd
    if not patch.strip():
        raise BadRequest("patch is empty", 422)
    if shutil.which("git"):
        argv = ["git", "apply", "--verbose", "--whitespace=nowarn", "-"]
        if not os.path.isdir(os.path.join(cwd, ".git")):
            argv.insert(2, "--unsafe-paths")
    elif shutil.which("patch"):
        argv = ["patch", "-p1", "--forward", "--batch"]
        if os.path.basename(os.path.realpath(shutil.which("patch"))) == "busybox":
            argv = ["patch", "-p1", "-N"]  # BusyBox knows no --batch (and never prompts)
    else:
        raise BadRequest("neither git nor patch is available in this sandbox", 501)
    res = runner.run({"command": argv, "cwd": cwd, "timeout": timeout, "stdin": patch})
    return {
        "success": res["exit_code"] == 0,
        "stdout": res["stdout"],
        "stderr": res["stderr"],
        "exit_code": res["exit_code"],
    }


# --------------------------------------------------------------------------- http


def _reject_constant(name: str):
    raise BadRequest(f"non-finite numbers ({name}) are not allowed", 422)


def _number(req: dict, key: str, default, *, positive: bool = False, integer: bool = False,
            maximum: float | None = None):
    """A finite, non-negative number (positive: > 0; integer: an int) from a request."""
    value = req.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise BadRequest(f"{key} must be {'an integer' if integer else 'a number'}", 422)
    if not math.isfinite(value):
        raise BadRequest(f"{key} must be a finite number", 422)
    if value < 0 or (positive and value == 0):
        raise BadRequest(f"{key} must be {'positive' if positive else 'non-negative'}", 422)
    if maximum is not None and value > maximum:
        raise BadRequest(f"{key} must be at most {maximum:g}", 422)
    return value


def _typed(req: dict, key: str, types, default):
    value = req.get(key, default)
    if value is None or value is default:
        return value
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise BadRequest(f"{key} has the wrong type", 422)
    if not isinstance(value, types):
        raise BadRequest(f"{key} has the wrong type", 422)
    return value


def _only_keys(req: dict, allowed: set[str]) -> None:
    unknown = set(req) - allowed
    if unknown:
        raise BadRequest(f"unknown fields: {sorted(unknown)}", 422)


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


PHRASES = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 409: "Conflict", 411: "Length Required", 413: "Payload Too Large",
           414: "URI Too Long", 422: "Unprocessable Entity", 431: "Request Header Fields Too Large",
           408: "Request Timeout", 500: "Internal Server Error", 501: "Not Implemented"}
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
    ("GET", "/jobs"): Handler.jobs,
    ("POST", "/jobs/*/cancel"): Handler.cancel,
}


class _QuietErrors:
    def handle_error(self, request, client_address):  # a client hung up mid-request
        if os.environ.get("ORCHARD_AGENT_DEBUG"):
            super().handle_error(request, client_address)


class UnixHTTPServer(_QuietErrors, socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self):
        try:
            os.unlink(self.server_address)
        except FileNotFoundError:
            pass
        super().server_bind()
        os.chmod(self.server_address, 0o600)


class TCPHTTPServer(_QuietErrors, socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().server_bind()


def _apply_limits(memory: int | None, cpus: float | None) -> None:
    """Limits the agent sets on itself, so that every command inherits them."""
    if memory:
        import resource

        # the agent itself needs some room beyond what its commands get
        resource.setrlimit(resource.RLIMIT_AS, (memory + 64 * 2**20, memory + 64 * 2**20))
    if cpus and hasattr(os, "sched_setaffinity"):
        available = sorted(os.sched_getaffinity(0))
        want = max(1, min(len(available), int(-(-cpus // 1))))
        start = (os.getpid() * 7) % len(available)  # spread sandboxes over the cores
        os.sched_setaffinity(0, {available[(start + i) % len(available)] for i in range(want)})


def _use_cgroups(join_fds: list[int], job_fd: int | None) -> None:
    """Join the sandbox's cgroups (before any command runs) and make jobs below them."""
    global JOB_CGROUPS
    if job_fd is not None:
        JOB_CGROUPS = JobCgroups(job_fd)
    for fd in join_fds:
        _write_at(fd, "cgroup.procs", "0")  # "0": the writer itself


def shutdown(runner: Runner) -> None:
    """Kill our jobs and everything else of this sandbox, then exit."""
    runner.kill_all()
    sandbox = os.environ.get("ORCHARD_SANDBOX")
    if sandbox:
        kill_marked(f"ORCHARD_SANDBOX={sandbox}")
    os._exit(0)


def _watch_parent(parent: int, runner: Runner) -> None:
    """Exit (killing our jobs) when the process that started us is gone."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            shutdown(runner)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="orchard-agent", description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--socket", help="serve on this unix socket path")
    where.add_argument("--port", type=int, help="serve on this TCP port")
    p.add_argument("--host", default="0.0.0.0", help="TCP address to bind (with --port)")
    p.add_argument("--token-sha256", metavar="HEX", help="SHA-256 of the bearer token, hex (else "
                   "$ORCHARD_AGENT_TOKEN_SHA256): the token itself then never enters the sandbox")
    p.add_argument("--token-file", help="file holding the bearer token (else $ORCHARD_AGENT_TOKEN)")
    p.add_argument("--cwd", default=None, help="default working directory of commands")
    p.add_argument("--max-output", type=int, default=DEFAULT_MAX_OUTPUT, help="bytes kept per stream")
    p.add_argument("--exit-with-parent", action="store_true", help="exit when the parent process dies")
    p.add_argument("--ready-file", help="touch this file once serving")
    p.add_argument("--limit-memory", type=int, help="address-space limit in bytes for every command")
    p.add_argument("--limit-cpus", type=float, help="pin commands to this many CPUs")
    p.add_argument("--cgroup-fd", type=int, action="append", default=[],
                   help="an open cgroup directory to join at start (repeatable)")
    p.add_argument("--job-cgroup-fd", type=int, help="an open cgroup directory to make per-command cgroups in")
    p.add_argument("--max-file-size", type=int, default=DEFAULT_MAX_FILE,
                   help="largest file GET /files serves, bytes (past it: 413)")
    p.add_argument("--files-root", action="append", default=[],
                   help="a folder the file routes may reach besides --cwd (repeatable; '/' for all)")
    p.add_argument("--read-timeout", type=float, default=HTTPHandler.read_timeout,
                   help="seconds a request's head may take from its first byte (bodies get 64 KiB/s more)")
    p.add_argument("--idle-timeout", type=float, default=HTTPHandler.idle_timeout,
                   help="seconds an idle kept-alive connection is kept")
    args = p.parse_args(argv)
    for name in ("max_output", "max_file_size", "read_timeout", "idle_timeout"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            p.error(f"--{name.replace('_', '-')} must be a positive finite number")

    digest = args.token_sha256 or os.environ.get("ORCHARD_AGENT_TOKEN_SHA256", "")
    if digest:
        try:
            token_sha256 = bytes.fromhex(digest)
        except ValueError:
            token_sha256 = b""
        if len(token_sha256) != 32:
            p.error("--token-sha256 must be 64 hex digits")
    else:  # the token itself (tests, hand-run agents): hashed, then dropped
        if args.token_file:
            with open(args.token_file) as f:
                token = f.read().strip()
        else:
            token = os.environ.get("ORCHARD_AGENT_TOKEN", "")
        if not token:
            p.error("a token is required: --token-sha256, $ORCHARD_AGENT_TOKEN_SHA256, --token-file "
                    "or $ORCHARD_AGENT_TOKEN")
        token_sha256 = sha256(token.encode("utf-8", "surrogateescape")).digest()
    os.environ.pop("ORCHARD_AGENT_TOKEN", None)

    cwd = os.path.abspath(args.cwd or os.getcwd())
    threading.stack_size(512 * 1024)  # a thread per connection: keep the address space small
    runner = Runner(cwd, args.max_output)
    Handler.runner, Handler.token_sha256, Handler.started = runner, token_sha256, time.monotonic()
    Handler.files_roots = [os.path.realpath(r) for r in [cwd, *args.files_root]]
    Handler.max_file_size, Handler.read_timeout, Handler.idle_timeout = (
        args.max_file_size, args.read_timeout, args.idle_timeout)
    parent = os.getppid()
    _prctl_setup()
    _apply_limits(args.limit_memory, args.limit_cpus)
    _use_cgroups(args.cgroup_fd, args.job_cgroup_fd)

    if args.socket:
        server = UnixHTTPServer(args.socket, Handler)
    else:
        server = TCPHTTPServer((args.host, args.port), Handler)

    def stop(signum, frame):
        shutdown(runner)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=_reaper_loop, daemon=True).start()
    if args.exit_with_parent:
        threading.Thread(target=_watch_parent, args=(parent, runner), daemon=True).start()
    if args.ready_file:
        open(args.ready_file, "w").close()
    server.serve_forever(poll_interval=3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
