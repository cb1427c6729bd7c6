"""Parent of the SWE grader's verdict run: runs the tests, collects per-test verdicts from a pipe.

Not imported by orchard-gym: `verdicts.py` uploads it into the grading sandbox and runs it
with the task's Python (stdlib only, Python 3.6+):

    python3 verdict_driver.py PLUGIN_DIR PLUGIN_MODULE LOG TIMEOUT -- ARGV...   (nonce on stdin)

It makes itself undumpable (so a process of the same user can neither read its memory nor
open its descriptors through /proc), makes a pipe, and runs ARGV (the task's test command)
in a new session with the pipe's write end, a fresh token, and `-p PLUGIN_MODULE` added to
PYTEST_ADDOPTS; the tests' output goes to LOG, never to this process's stdout. It keeps only
pipe lines that carry the token (`verdict_plugin.py` writes them), kills what the tests
left running in their session, and prints one line for the grader:
`ORCHARD-VERDICTS <nonce> <json>`. The nonce came on stdin and lives only in this process,
so nothing the tests print or leave behind can forge that line.
"""

import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time

LOG_TAIL = 2048


def undumpable():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError, ImportError):
        return False


def read_pipe(fd, child, deadline):
    """Everything written to the pipe while the child runs (and until its writers are gone)."""
    chunks, timed_out = [], False
    while True:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            data = os.read(fd, 65536)
            if not data:
                break  # every writer is gone
            chunks.append(data)
        if child.poll() is not None and not ready:
            break  # the child is gone and the pipe is quiet (a writer it left is not waited for)
        if time.monotonic() > deadline:
            timed_out = True
            break
    return chunks, timed_out


def main():
    nonce = sys.stdin.readline().strip()
    hardened = undumpable()
    plugin_dir, module, log, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    argv = sys.argv[sys.argv.index("--") + 1:]
    token = secrets.token_hex(16)
    r, w = os.pipe()
    env = dict(os.environ)
    env.update(ORCHARD_VERDICT_FD=str(w), ORCHARD_VERDICT_TOKEN=token,
               PYTHONPATH=os.pathsep.join(p for p in (plugin_dir, env.get("PYTHONPATH")) if p),
               PYTEST_ADDOPTS=" ".join(p for p in ("-p " + module, env.get("PYTEST_ADDOPTS")) if p))
    with open(log, "wb") as out:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                 pass_fds=(w,), start_new_session=True)
    os.close(w)
    chunks, timed_out = read_pipe(r, child, time.monotonic() + timeout)
    try:
        os.killpg(child.pid, signal.SIGKILL)  # the tests' session: whatever they left running
    except OSError:
        pass
    code = child.wait()
    more, _ = read_pipe(r, child, time.monotonic() + 1.0)  # a writer outside the session: stop after 1 s
    chunks += more
    result = {"exit_code": code, "timed_out": timed_out, "started": 0, "ended": 0, "tests": {}, "tamper": [],
              "unsupported": [], "foreign_lines": 0, "undumpable": hardened}
    for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
        mark, _, body = line.partition("\t")
        try:
            if mark != token:
                raise ValueError(line)
            msg = json.loads(body)
            kind = msg["k"]
        except (ValueError, KeyError, TypeError):
            result["foreign_lines"] += 1
            continue
        if kind == "test":
            result["tests"][str(msg["id"])] = str(msg["s"])
        elif kind in ("tamper", "unsupported"):
            result[kind].append(str(msg["what"]))
        elif kind in ("start", "end"):
            result["started" if kind == "start" else "ended"] += 1
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.path.getsize(log) - LOG_TAIL))
            result["log_tail"] = f.read().decode("utf-8", "replace")
    except OSError:
        result["log_tail"] = ""
    sys.stdout.write("ORCHARD-VERDICTS " + nonce + " " + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
