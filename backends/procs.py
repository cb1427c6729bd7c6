"""Process helpers for the local backend: identity that survives pid reuse, tree kills, log tails."""

from __future__ import annotations

import os
import signal
import sys
import time

_LINUX = sys.platform.startswith("linux")


def log_tail(path, label: str, size: int = 600) -> str:
    """"; LABEL log: <its last bytes>" for an error message, or "" when there is none."""
    try:
        with open(path, "rb") as f:
            data = f.read()[-size:].decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return f"; {label} log: {data}" if data else ""


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: split after the last ')'
    return raw[raw.rindex(b")") + 2 :].decode().split()


def identity(pid: int) -> dict:
    """A pid plus its start time, so a reused pid is never mistaken for the original."""
    st = _stat(pid) if _LINUX else None
    return {"pid": pid, "start": st[19] if st else None}


def alive(ident: dict | None) -> bool:
    if not ident:
        return False
    pid = ident["pid"]
    if not _LINUX:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    st = _stat(pid)
    if st is None or st[0] in ("Z", "X"):
        return False
    return ident.get("start") is None or st[19] == ident["start"]


def children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids.extend(int(p) for p in f.read().split())
    except OSError:
        pass
    return kids


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out.extend(kids)
        todo.extend(kids)
    return out


def marked(needle: str) -> list[int]:
    """Processes whose initial environment holds `needle` (e.g. ORCHARD_SANDBOX=sb-1)."""
    want, me, found = needle.encode(), os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def kill_tree(ident: dict | None, marker: str | None = None) -> None:
    """SIGKILL a process, all its descendants and (optionally) every marked process."""
    if not ident or not alive(ident):
        pids = []
    else:
        pid = ident["pid"]
        if not _LINUX:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            return
        # stop first so nothing forks while we collect the tree
        pids = [pid]
        _signal(pid, signal.SIGSTOP)
        for child in descendants(pid):
            _signal(child, signal.SIGSTOP)
            pids.append(child)
    for _ in range(20):
        if marker and _LINUX:
            pids = list({*pids, *marked(marker)})
        if not pids:
            return
        for p in pids:
            _signal(p, signal.SIGKILL)
        pids = []
        if not marker:
            return
        time.sleep(0.01)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass
