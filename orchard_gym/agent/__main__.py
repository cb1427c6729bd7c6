#!/usr/bin/env python3
"""The execution agent that runs inside every sandbox.

It is injected into images we do not control, so it uses the Python standard
library only (one folder of modules, see __init__.py). It serves a small JSON-over-HTTP API on a
TCP port or a unix socket:

    GET  /health                      no auth: {"status", "version", "uptime"}
    POST /exec                        run a command, return its output
    POST /exec/stream                 the same, streamed as NDJSON chunks
    POST /files                       upload {path, content (base64), mode}
    PUT  /files?path=P&mode=M         upload raw bytes
    GET  /files?path=P                download raw bytes
    GET  /files/list?path=P           list a directory
    POST /patch                       apply a unified diff with git (or patch)
    POST /pty                         a command on a terminal: 101, then JSON-line frames (ptys.py)
    POST /connect                     {"port"}: 101, then bytes to and from 127.0.0.1:port (tunnel.py)
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

Run `python3 -I -S -B orchard_gym/agent/ --help` for options (a folder: see __init__.py).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
import time

import jobs
from common import DEFAULT_MAX_FILE, DEFAULT_MAX_OUTPUT
from httpd import Handler, HTTPHandler, TCPHTTPServer, UnixHTTPServer, sha256
from jobs import JobCgroups, Runner, _prctl_setup, _reaper_loop, _write_at, kill_marked
from scope import scope_abstract_unix_sockets


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
    if job_fd is not None:
        jobs.JOB_CGROUPS = JobCgroups(job_fd)
    jobs.SANDBOX_CGROUPS = list(join_fds)
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
    p.add_argument("--scope-abstract-sockets", action="store_true",
                   help="no connection to abstract unix sockets made outside (Landlock; fails where the kernel cannot)")
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
    if args.scope_abstract_sockets:
        scope_abstract_unix_sockets()  # before any command: every one inherits it

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
    server.serve_until_signalled()
    return 0


if __name__ == "__main__":
    sys.exit(main())
