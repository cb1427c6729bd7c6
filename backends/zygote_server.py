"""The zygote: one interpreter with the agent imported that forks each local sandbox.

    python3 -I -S -B zygote_server.py --control-fd N --agent AGENT_DIR [--kill-on-exit]

Started by backends/zygote.py, which keeps the other end of the control socket (a
SOCK_SEQPACKET socketpair: no path, so no sandbox and no other process can reach it). The
zygote reads nothing of any sandbox: a control message is exactly b"S" plus one fd, a fresh
socket for one request; it forks, and the child (never the zygote) reads the request on
that socket. So the zygote's memory, which every sandbox inherits, holds no sandbox's token
hash, paths or environment. Anything else on the control socket is refused (logged, fds
closed).

Per request, in the child C1: close every fd but the request socket; read and check the
request (JSON + fds: the agent's log, the sandbox's cgroup dirs); setsid; unshare the
namespaces; join the cgroups; fork C2 (pid 1 of the new PID namespace); tell the backend C2's
pid; exit. C2 sets the sandbox up (zygote_ns; a failure goes to the agent's log, and the
backend's ready-wait reports it) and runs the agent's main().
The zygote is a child subreaper: C2s are re-parented to it and reaped here. When the
control socket closes (the backend closed or died) the zygote exits, killing its
sandboxes first with --kill-on-exit (the backend's die_with_client).

Stdlib only; the request format is `zygote.request()` on the backend side.
"""

from __future__ import annotations

import argparse
import array
import importlib.util
import json
import os
import re
import select
import signal
import socket
import sys
import traceback

MAX_REQUEST = 256 * 1024
MAX_FDS = 16
KEYS = {"v": int, "sandbox_id": str, "workdir": str, "workdir_at": str, "rundir": str, "view": list,
        "network": str, "env": dict, "agent_args": list, "cgroup_fds": int, "job_cgroup_index": (int, type(None)),
        "tmp_size": (int, type(None))}
_SANDBOX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
PR_SET_CHILD_SUBREAPER = 36


class BadRequest(ValueError):
    pass


def _path(value, name: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value or os.path.normpath(value) != value:
        raise BadRequest(f"{name} must be a normalised absolute path")
    return value


def check_request(req, nfds: int) -> dict:
    """The request, or BadRequest saying what is wrong with it."""
    if not isinstance(req, dict) or set(req) != set(KEYS):
        raise BadRequest(f"a request is an object with exactly the keys {sorted(KEYS)}")
    for key, kind in KEYS.items():
        if isinstance(req[key], bool) or not isinstance(req[key], kind):
            raise BadRequest(f"{key} has the wrong type")
    if req["v"] != 1:
        raise BadRequest(f"unknown request version {req['v']}")
    if not _SANDBOX_ID.match(req["sandbox_id"]):
        raise BadRequest("bad sandbox_id")
    for key in ("workdir", "workdir_at", "rundir"):
        _path(req[key], key)
    import local_view

    local_view.check_steps(req["view"])  # ValueError: refused
    if req["network"] not in ("none", "host"):
        raise BadRequest("network must be 'none' or 'host'")
    for k, v in req["env"].items():
        if not isinstance(v, str) or not k or "=" in k or "\0" in k or "\0" in v:
            raise BadRequest("env must map names to strings, without '=' in names or NUL bytes")
    if not all(isinstance(a, str) and "\0" not in a for a in req["agent_args"]):
        raise BadRequest("agent_args must be strings")
    if not 0 <= req["cgroup_fds"] <= MAX_FDS - 1 or nfds != 1 + req["cgroup_fds"]:
        raise BadRequest(f"expected the log fd and {req['cgroup_fds']} cgroup fds, got {nfds} fds")
    if req["tmp_size"] is not None and req["tmp_size"] <= 0:
        raise BadRequest("tmp_size must be a positive byte count")
    job = req["job_cgroup_index"]
    if job is not None and not 0 <= job < req["cgroup_fds"]:
        raise BadRequest("job_cgroup_index is out of range")
    return req


def _recv(sock: socket.socket, size: int) -> tuple[bytes, list[int]]:
    data, ancdata, flags, _ = sock.recvmsg(size, socket.CMSG_SPACE(MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC)
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise BadRequest("message or its fds too large")
    return data, list(fds)


def _send(sock: socket.socket, **msg) -> None:
    try:
        sock.send(json.dumps(msg).encode())
    except OSError:
        pass  # the backend gave up on this request: it sees the sandbox fail


def _close_all_but(keep: set[int]) -> None:
    top = os.sysconf("SC_OPEN_MAX")
    low = 0
    for fd in sorted(keep) + [top]:
        if low < fd:  # closerange(n, n) would close everything (high - 1 wraps around)
            os.closerange(low, fd)
        low = fd + 1


def serve_request(conn_fd: int, agent_main) -> None:
    """C1: one request, in a fresh child of the zygote. Never returns."""
    _close_all_but({0, 1, 2, conn_fd})  # 0-2: the zygote's /dev/null and log, until C2 replaces them
    conn = socket.socket(fileno=conn_fd)
    try:
        conn.settimeout(10)
        data, fds = _recv(conn, MAX_REQUEST)
        try:
            req = check_request(json.loads(data), len(fds))
        except ValueError as e:  # BadRequest and bad JSON alike
            raise BadRequest(f"refused: {e}") from None
        log_fd, cgroup_fds = fds[0], fds[1:]
        from jobs import _write_at  # the agent's own helper

        os.setsid()
        import zygote_ns as ns

        flags = ns.CLONE_NEWNS | ns.CLONE_NEWPID | ns.CLONE_NEWIPC | ns.CLONE_NEWUTS | ns.CLONE_NEWCGROUP
        if req["network"] == "none":
            flags |= ns.CLONE_NEWNET
        ns.unshare(flags)
        # after the cgroup namespace (rooted at the backend's cgroup, as bwrap's) and before the
        # fork: every process of the sandbox is in its cgroups
        for fd in cgroup_fds:
            _write_at(fd, "cgroup.procs", "0")
        pid = os.fork()
        if pid == 0:
            conn.close()  # the backend waits for the pid only: C2's failures land in its log
            _sandbox_main(req, log_fd, cgroup_fds, agent_main)
        _send(conn, pid=pid)
    except BadRequest as e:
        _send(conn, error=str(e))
        os._exit(2)
    except Exception as e:
        _send(conn, error=f"{type(e).__name__}: {e}")
        os._exit(1)
    os._exit(0)


def _sandbox_main(req: dict, log_fd: int, cgroup_fds: list[int], agent_main) -> None:
    """C2, pid 1 of the sandbox's PID namespace: set it up, then become its agent. Never returns."""
    import zygote_ns as ns

    try:
        ns.set_up_mounts(req["workdir"], req["rundir"], req["view"], req["workdir_at"], req["tmp_size"])
        socket.sethostname(req["sandbox_id"][:63])
        if req["network"] == "none":
            ns.loopback_up()
        os.chdir(req["workdir_at"])
        ns.drop_capabilities()
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        argv = list(req["agent_args"])
        for fd in cgroup_fds:
            os.set_inheritable(fd, False)
            argv += ["--cgroup-fd", str(fd)]
        if req["job_cgroup_index"] is not None:
            argv += ["--job-cgroup-fd", str(cgroup_fds[req["job_cgroup_index"]])]
        os.environ.clear()
        os.environ.update(req["env"])
        _close_all_but({0, 1, 2, *cgroup_fds})
    except Exception as e:  # the backend's ready-wait sees the agent gone, with this in its log tail
        os.write(log_fd, f"zygote: sandbox set-up failed: {type(e).__name__}: {e}\n".encode())
        os._exit(1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as in a fresh interpreter
    code = 1
    try:
        sys.argv = ["orchard-agent", *argv]
        code = agent_main(argv) or 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _peer_gone(sock: socket.socket) -> bool:
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return any(ev & (select.POLLHUP | select.POLLERR) for _, ev in poller.poll(0))


def _children() -> list[int]:
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _load_agent(agent_dir: str):
    """The agent's main(), imported once here (the per-sandbox cost this removes)."""
    sys.path[:0] = [agent_dir, os.path.dirname(os.path.abspath(__file__))]
    spec = importlib.util.spec_from_file_location("orchard_agent_main", os.path.join(agent_dir, "__main__.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import local_view  # noqa: F401
    import resource  # noqa: F401  what the agent imports lazily
    import zygote_ns

    if not zygote_ns.has_mount_setattr():
        raise SystemExit("zygote: the kernel has no mount_setattr (Linux 5.12+ needed)")
    if zygote_ns.SYS_PIVOT_ROOT is None:
        raise SystemExit(f"zygote: no pivot_root syscall number known for {os.uname().machine}")
    return module.main


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--control-fd", type=int, required=True)
    p.add_argument("--agent", required=True, help="the agent folder (orchard_gym/agent)")
    p.add_argument("--kill-on-exit", action="store_true", help="kill the sandboxes when the backend goes")
    args = p.parse_args()
    agent_main = _load_agent(args.agent)
    control = socket.socket(fileno=args.control_fd)
    os.set_inheritable(control.fileno(), False)
    import ctypes

    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    import gc

    gc.freeze()  # what is imported stays out of the collector's reach: fewer copy-on-write pages per fork
    control.send(b"R")  # ready: imports done
    while True:
        ready, _, _ = select.select([control], [], [], 0.2)
        _reap()
        if not ready:
            continue
        try:
            data, fds = _recv(control, 16)
        except BadRequest as e:
            print(f"zygote: {e}", file=sys.stderr, flush=True)
            continue
        except OSError:
            data, fds = b"", []
        if not data and not fds and _peer_gone(control):  # EOF (not an empty message): the backend is gone
            break
        if data != b"S" or len(fds) != 1:
            print(f"zygote: refused a control message of {len(data)} bytes with {len(fds)} fds", file=sys.stderr,
                  flush=True)
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            control.close()
            serve_request(fds[0], agent_main)
        os.close(fds[0])
    if args.kill_on_exit:
        for pid in _children():
            try:
                os.kill(pid, signal.SIGKILL)  # each is pid 1 of a PID namespace: the whole sandbox goes
            except OSError:
                pass
    _reap()
    return 0


if __name__ == "__main__":
    sys.exit(main())
