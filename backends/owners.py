"""Who owns a sandbox: the identity of the creating process (host, boot, pid, start time),
and whether that owner is gone. Backends label what they create with it so that a later
process can sweep what a dead one left behind (docker, kubernetes)."""

from __future__ import annotations

import os
import socket

from . import procs


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()[:8]
    except OSError:
        return "-"


def owner_identity(pid: int | None = None) -> str:
    """host:boot:pid:start of a process; the boot id tells a reboot from a live owner."""
    ident = procs.identity(pid or os.getpid())
    return f"{socket.gethostname()}:{_boot_id()}:{ident['pid']}:{ident['start']}"


def owner_gone(owner: str) -> bool:
    """True only when we can tell: an owner on this host whose process is dead."""
    parts = owner.split(":")
    if len(parts) != 4 or parts[0] != socket.gethostname():
        return False
    if parts[1] != _boot_id():
        return True
    try:
        pid = int(parts[2])
    except ValueError:
        return False
    return not procs.alive({"pid": pid, "start": None if parts[3] == "None" else parts[3]})
