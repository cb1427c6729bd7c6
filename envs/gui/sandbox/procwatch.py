"""What the GUI daemon reads from /proc: a terminal's shell waiting for input, the sandbox's memory,
the processes running (with their start times: sandbox/quiesce.py).

Standard library only (it runs in the sandbox with the agent's Python, next to gui_daemon.py).
"""

from __future__ import annotations

import os

# the syscalls (and, without /proc/PID/syscall, the kernel wait channels) of a process blocked reading its tty
WAIT_SYSCALLS = {"x86_64": {0, 7, 23, 270, 271}, "aarch64": {63, 72, 73}}.get(os.uname().machine, set())
WAIT_CHANNELS = ("n_tty_read", "wait_woken", "poll_schedule_timeout", "do_select", "do_sys_poll")


def _stat(pid: str) -> list[str] | None:
    """/proc/PID/stat's fields after the command name: [state, ppid, pgrp, session, tty_nr, tpgid, ...]."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def foreground_shells(root: int) -> list[int]:
    """The foreground process-group leaders of the ttys that `root`'s descendants hold
    (a terminal's shell, or the command running in it)."""
    stats = {int(p): st for p in os.listdir("/proc") if p.isdigit() and (st := _stat(p))}
    children: dict[int, list[int]] = {}
    for pid, st in stats.items():
        children.setdefault(int(st[1]), []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        st = stats[pid]
        if int(st[4]) != 0 and int(st[5]) == pid:  # has a controlling tty and leads its foreground group
            found.append(pid)
    return found


def waiting_for_input(pid: int) -> bool:
    st = _stat(str(pid))
    if not st or st[0] != "S":
        return False
    try:  # the syscall it sleeps in (needs ptrace rights: a descendant of this daemon has them)
        with open(f"/proc/{pid}/syscall") as f:
            first = f.read().split()
        if first and first[0].isdigit() and WAIT_SYSCALLS:
            return int(first[0]) in WAIT_SYSCALLS
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return f.read().startswith(WAIT_CHANNELS)
    except OSError:
        return False


def sandbox_pss_kib() -> int:
    """Proportional memory of every process this sandbox's PID namespace shows."""
    total = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    for line in f:
                        if line.startswith("Pss:"):
                            total += int(line.split()[1])
                            break
            except OSError:
                pass
    return total


def processes() -> dict[str, dict]:
    """The processes in this sandbox's PID namespace now: {pid: {ppid, state, start, comm}}. A pid
    with its start time names one process (a pid the kernel reuses comes with a later start)."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        head, _, rest = text.rpartition(")")
        fields = rest.split()
        if len(fields) > 19:
            out[pid] = {"ppid": fields[1], "state": fields[0], "start": fields[19], "comm": head.partition("(")[2]}
    return out
