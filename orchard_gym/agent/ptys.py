"""Interactive processes: a command on a pseudo-terminal, driven over one connection.

`POST /pty` with the init object as its body answers `101 Switching Protocols`; from then
on both sides send JSON lines, the frames of Orchard Env's `exec(pty=True)` protocol:

    client -> agent   {"type": "stdin", "data": B64}   {"type": "resize", "rows": R, "cols": C}
                      {"type": "signal", "sig": "INT"|"TERM"|"KILL"|"HUP"|"QUIT"}   {"type": "close"}
    agent -> client   {"type": "ready", "pid": N}   {"type": "stdout", "data": B64}
                      {"type": "exit", "code": N}   (negative: killed by that signal)
                      {"type": "error", "message": TEXT}

The init object: {"cmd": [argv] or "shell string", "env": {}, "cwd": "dir", "rows": 24,
"cols": 80, "login_shell": false} ("type": "init" allowed). A bad init is answered with a
4xx before the upgrade; a bad frame afterwards with an error frame, and the session ends.
When the client hangs up (or sends close), the command's whole tree is killed: a session
never outlives its connection.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import selectors
import signal
import struct
import subprocess
import termios
import threading
import time

import jobs
from common import JOB_MARKER, BadRequest, _only_keys, _typed
from jobs import _pidfd, _tracked_lock, _tracked_pids, kill_job, prefer_for_oom

SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "HUP": signal.SIGHUP,
           "QUIT": signal.SIGQUIT}
MAX_FRAME = 8 << 20  # bytes in one client frame (a base64 stdin chunk of 6 MiB)
DRAIN_GRACE = 0.2  # seconds to keep reading the terminal after the command exits


def _size(req: dict, key: str, default: int) -> int:
    value = req.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10000:
        raise BadRequest(f"{key} must be an integer from 1 to 10000", 422)
    return value


def parse_init(req: dict, runner) -> dict:
    if req.get("type", "init") != "init":
        raise BadRequest("the first frame must be type=init", 422)
    _only_keys(req, {"type", "cmd", "command", "env", "cwd", "rows", "cols", "login_shell"})
    cmd = req.get("cmd", req.get("command"))
    if cmd is None:
        raise BadRequest("missing field: cmd", 422)
    try:
        argv = runner.argv(cmd, bool(_typed(req, "login_shell", bool, False)))
    except BadRequest as e:
        raise BadRequest(f"cmd: {e}", 422) from None
    env = _typed(req, "env", dict, None) or {}
    if not all(isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
               for k, v in env.items()):
        raise BadRequest("env must map names (no '=', no NUL) to strings", 422)
    cwd = os.path.join(runner.default_cwd, _typed(req, "cwd", str, None) or "")
    if not os.path.isdir(cwd):
        raise BadRequest(f"cwd does not exist: {cwd}", 422)
    return {"argv": argv, "env": env, "cwd": cwd, "rows": _size(req, "rows", 24), "cols": _size(req, "cols", 80)}


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def spawn(init: dict) -> tuple[subprocess.Popen, str, int]:
    """Start the command as the leader of a new session whose controlling terminal is a
    fresh pty; returns (process, kill marker, the pty's master fd)."""
    master, slave = os.openpty()
    marker = os.urandom(16).hex()
    env = dict(os.environ)
    env.pop("ORCHARD_AGENT_TOKEN", None)
    env.pop("ORCHARD_AGENT_TOKEN_SHA256", None)
    env.setdefault("TERM", "xterm-256color")
    env.update(init["env"])
    env[JOB_MARKER] = marker
    joining = jobs.JOB_CGROUPS.joining(marker, init["argv"]) if jobs.JOB_CGROUPS is not None else jobs.as_is(init["argv"])
    proc = None
    try:
        _set_size(slave, init["rows"], init["cols"])
        with joining as (argv, pass_fds, hook), _tracked_lock:
            def child_setup():  # after setsid: the slave (fd 0) becomes the controlling terminal
                if hook is not None:
                    hook()
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)
                prefer_for_oom("self")

            proc = subprocess.Popen(argv, cwd=init["cwd"], env=env, stdin=slave, stdout=slave, stderr=slave,
                                    start_new_session=True, preexec_fn=child_setup, pass_fds=pass_fds)
            _tracked_pids.add(proc.pid)
    except FileNotFoundError as e:
        os.close(master)
        raise BadRequest(f"executable not found: {e.filename}", 422)
    except PermissionError as e:
        os.close(master)
        raise BadRequest(f"permission denied: {e.filename}", 422)
    finally:
        os.close(slave)
        if proc is None and jobs.JOB_CGROUPS is not None:  # it never started: its cgroup is empty
            jobs.JOB_CGROUPS.release(marker)
    return proc, marker, master


class Session:
    """One running pty command and its client connection (the handler's rfile/wfile)."""

    def __init__(self, handler, proc: subprocess.Popen, marker: str, master: int):
        self.handler, self.proc, self.marker, self.master = handler, proc, marker, master
        self.lock = threading.Lock()  # frames from two threads: one write at a time
        self.done = threading.Event()

    def send(self, frame: dict) -> bool:
        line = json.dumps(frame).encode() + b"\n"
        with self.lock:
            try:
                self.handler.wfile.write(line)
                self.handler.wfile.flush()
                return True
            except OSError:
                return False

    def end(self) -> None:
        """The client is gone or asked to stop: kill the command's whole tree."""
        if not self.done.is_set():
            kill_job(self.proc, self.marker)

    def read_client(self) -> None:
        """Client frames until it hangs up; then (or on a bad frame) the command is killed."""
        rfile = self.handler.rfile
        try:
            while not self.done.is_set():
                line = rfile.readline(MAX_FRAME + 1)
                if not line:
                    break  # hung up
                if len(line) > MAX_FRAME:
                    self.send({"type": "error", "message": f"frame larger than {MAX_FRAME} bytes"})
                    break
                if not line.strip():
                    continue
                try:
                    if not self.apply(json.loads(line)):
                        break
                except (ValueError, TypeError, KeyError, BadRequest) as e:
                    self.send({"type": "error", "message": f"bad frame: {e}"})
                    break
        except OSError:
            pass
        self.end()

    def apply(self, frame) -> bool:
        """Carry out one client frame; False: the session ends."""
        if not isinstance(frame, dict):
            raise BadRequest("a frame must be a JSON object")
        kind = frame.get("type")
        if kind == "stdin":
            data = frame.get("data")
            if not isinstance(data, str):
                raise BadRequest("stdin needs data: a base64 string")
            raw = base64.b64decode(data, validate=True)
            while raw:
                try:
                    raw = raw[os.write(self.master, raw):]
                except BlockingIOError:  # the terminal's input queue is full: let the command read
                    time.sleep(0.01)
                except OSError:
                    return not self.done.is_set()  # the terminal is gone: the exit frame follows
        elif kind == "resize":
            rows, cols = _size(frame, "rows", 24), _size(frame, "cols", 80)
            _set_size(self.master, rows, cols)  # the kernel sends SIGWINCH to the foreground group
        elif kind == "signal":
            sig = SIGNALS.get(str(frame.get("sig", "TERM")).upper().removeprefix("SIG"))
            if sig is None:
                raise BadRequest(f"unknown signal {frame.get('sig')!r}; one of {sorted(SIGNALS)}")
            try:
                os.killpg(self.proc.pid, sig)
            except OSError:
                pass
        elif kind == "close":
            return False
        else:
            raise BadRequest(f"unknown frame type {kind!r}: stdin, resize, signal or close")
        return True

    def pump(self) -> int:
        """Terminal output to the client until the command exits and its terminal drains
        (every holder closed it: EIO, or DRAIN_GRACE without output after the exit)."""
        sel = selectors.DefaultSelector()
        os.set_blocking(self.master, False)
        sel.register(self.master, selectors.EVENT_READ, "out")
        pidfd = _pidfd(self.proc.pid)
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ, "exit")
        exited, terminal_open = False, True
        try:
            while terminal_open:
                exited = exited or self.proc.poll() is not None
                events = sel.select(DRAIN_GRACE if exited else (None if pidfd is not None else 0.05))
                if exited and not events:
                    break
                for key, _ in events:
                    if key.data == "exit":
                        sel.unregister(pidfd)  # poll() reaps it on the next turn
                        continue
                    try:
                        data = os.read(self.master, 65536)
                    except BlockingIOError:
                        continue
                    except OSError:  # EIO: every holder of the terminal has closed it
                        data = b""
                    if not data:
                        terminal_open = False
                        break
                    if not self.send({"type": "stdout", "data": base64.b64encode(data).decode("ascii")}):
                        kill_job(self.proc, self.marker)  # nobody is reading any more
            return self.proc.wait()
        finally:
            sel.close()
            if pidfd is not None:
                os.close(pidfd)

    def finish(self) -> None:
        kill_job(self.proc, self.marker)  # what the command left behind on its terminal
        self.done.set()
        os.close(self.master)
        with _tracked_lock:
            _tracked_pids.discard(self.proc.pid)
        if jobs.JOB_CGROUPS is not None:
            jobs.JOB_CGROUPS.release(self.marker)


def serve(handler, req: dict) -> None:
    """The /pty route: check the init, start the command, switch protocols, run the session."""
    init = parse_init(req, handler.runner)
    proc, marker, master = spawn(init)
    session = Session(handler, proc, marker, master)
    handler.close_connection = True  # the connection is the session's: no request follows it
    try:
        handler.wfile.write(handler.send_head(101, [("Upgrade", "orchard-pty"), ("Connection", "Upgrade")]))
        handler.wfile.flush()
    except OSError:
        session.finish()
        return
    session.send({"type": "ready", "pid": proc.pid})
    reader = threading.Thread(target=session.read_client, daemon=True)
    reader.start()
    try:
        code = session.pump()
    finally:
        session.finish()
    session.send({"type": "exit", "code": code})
    try:
        handler.connection.shutdown(1)  # SHUT_WR: the client reads the end; its reader sees EOF
    except OSError:
        pass
    reader.join(5)
