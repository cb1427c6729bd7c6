"""Commands: starting them (argv, environment, cgroup), streaming their output with a
timeout, and killing their whole process tree (group, environment marker, cgroup)."""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from common import JOB_MARKER, KILL_GRACE, MAX_TIMEOUT, BadRequest, _number, _only_keys, _typed



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

    @contextlib.contextmanager
    def joining(self, marker: str, argv: list[str]):
        """A fresh job cgroup, and how a child started inside the block joins it before the
        command runs: yields (argv, pass_fds, preexec_fn) for Popen.

        v1: this thread alone moves into the job's cgroup (its `tasks` file, "0": the
        writer; a single thread's move skips the global threadgroup lock a whole-process
        move takes), the child is forked there and inherits it, and the thread moves back
        to the sandbox's cgroup on leaving. No preexec_fn, so Popen can vfork, and the
        command runs as given (no shell prefix).
        v2 (no per-thread moves outside threaded cgroups): a `bash -c` command joins itself
        (a prefix writes "0" to the inherited cgroup.procs fd, then closes it); any other
        command joins in a preexec_fn, which makes Popen fork instead of vfork."""
        name = f"job-{marker}"
        os.mkdir(name, dir_fd=self.fd)
        if not self.v2:
            _write_at(self.fd, f"{name}/tasks", "0")
            try:
                yield argv, (), None
            finally:  # never go on from inside a job's cgroup: its kill would take this thread
                _write_at(self.fd, "tasks", "0")
            return
        procs = os.open(f"{name}/cgroup.procs", os.O_WRONLY, dir_fd=self.fd)
        try:
            if len(argv) == 3 and os.path.basename(argv[0]) == "bash" and argv[1] in ("-c", "-lc"):
                joined = f"printf 0 >&{procs} || exit 125; exec {procs}>&-; {argv[2]}"
                yield [argv[0], argv[1], joined], (procs,), None
            else:
                yield argv, (), lambda: os.write(procs, b"0")
        finally:
            os.close(procs)

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


@contextlib.contextmanager
def as_is(argv: list[str]):
    """No job cgroup: the command as given, nothing to join."""
    yield argv, (), None


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
SANDBOX_CGROUPS: list[int] = []  # the sandbox's cgroup folders (main() sets them): its OOM kills count there


# ---------------------------------------------------------------------------- limits, in words
def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _first(names: tuple[str, ...]) -> str | None:
    for fd in SANDBOX_CGROUPS:
        for name in names:
            try:
                return _read_at(fd, name)
            except OSError:
                continue
    return None


def oom_kills() -> int:
    """Processes of the sandbox the kernel killed at its memory limit so far (v2 memory.events,
    v1 memory.oom_control); 0 without a memory cgroup."""
    return _counter(_first(("memory.events", "memory.oom_control")) or "", "oom_kill")


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def limits_hit(cwd: str, ooms_before: int) -> str | None:
    """What resource limit a failed command most likely hit, in words (None: none seen): an
    OOM kill in the sandbox while it ran, or a full file system under its cwd or /tmp."""
    said = []
    if oom_kills() > ooms_before:
        limit = (_first(("memory.max", "memory.limit_in_bytes")) or "").strip()
        at = f" ({_size(int(limit))})" if limit.isdigit() else ""
        said.append(f"out of memory: the kernel killed a process of this sandbox at its memory limit{at}")
    seen = set()
    for path in (os.path.normpath(cwd), "/tmp"):
        try:
            st, dev = os.statvfs(path), os.stat(path).st_dev
        except OSError:
            continue
        if dev in seen or not st.f_blocks:
            continue
        seen.add(dev)
        size = st.f_blocks * st.f_frsize
        if st.f_bavail * st.f_frsize < min(2 << 20, size // 10):  # a write of a few blocks failed
            said.append(f"no space left on device: the file system of {path} ({_size(size)}) is full")
        elif st.f_files and st.f_favail == 0:
            said.append(f"no space left on device: the file system of {path} has no free inodes")
    return "; ".join(said) or None


def prefer_for_oom(pid: int | str) -> None:
    """Make a command the OOM killer's first choice (oom_score_adj 1000; raising it needs no
    privilege), so that a command exhausting a memory-limited sandbox is killed, not the agent
    beside it (which then answered nothing: the sandbox looked dead). Set right after the spawn,
    which vfork makes cheap: a child the command forked before that keeps 0. Best effort."""
    try:
        fd = os.open(f"/proc/{pid}/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, b"1000")
        finally:
            os.close(fd)
    except OSError:
        pass


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
        ooms = oom_kills() if SANDBOX_CGROUPS else 0
        joining = JOB_CGROUPS.joining(marker, argv) if JOB_CGROUPS is not None else as_is(argv)
        proc = None
        try:
            with joining as (argv, pass_fds, hook), _tracked_lock:
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
            prefer_for_oom(proc.pid)
        except FileNotFoundError as e:
            raise BadRequest(f"executable not found: {e.filename}", 422)
        except PermissionError as e:
            raise BadRequest(f"permission denied: {e.filename}", 422)
        finally:
            if proc is None and JOB_CGROUPS is not None:  # it never started: its cgroup is empty
                JOB_CGROUPS.release(marker)
        with self.lock:
            self.active[job_id] = (proc, marker)
        if stdin is not None:
            threading.Thread(target=_feed_stdin, args=(proc, stdin.encode()), daemon=True).start()
        return Job(job_id, proc, marker, timeout, cwd, ooms)

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
        result = {
            "exit_code": -9 if timed_out else code,
            "duration": round(time.monotonic() - start, 6),
            "timed_out": timed_out,
            "truncated": truncated,
            "cancelled": cancelled,
            "job_id": job.job_id,
        }
        limit = limits_hit(job.cwd, job.ooms) if code != 0 and not (timed_out or cancelled) else None
        if limit:
            result["limit"] = limit
        yield "exit", result

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

    __slots__ = ("job_id", "proc", "marker", "timeout", "cwd", "ooms")

    def __init__(self, job_id: str, proc: subprocess.Popen, marker: str, timeout: float, cwd: str, ooms: int = 0):
        self.job_id, self.proc, self.marker, self.timeout = job_id, proc, marker, timeout
        self.cwd, self.ooms = cwd, ooms  # for the words on a limit it hit


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

