"""Removing and measuring any tree a sandbox can leave behind.

A policy decides what its workdir holds: folders nested deeper than Python's recursion
limit (Python 3.11's `shutil.rmtree` and `os.walk` recurse) and than PATH_MAX (no path can
name the bottom), folders of mode 000, immutable or append-only files (`chattr +i`, where a
sandbox has the capability), FIFOs and sockets, mounts. One such folder once failed a
delete and then every later sweep of its root. So:

- `remove_tree` first detaches every mount below the tree (a bind mount of a host folder
  would otherwise be emptied through it), then tries `shutil.rmtree` (in-process: the
  common, cheap case); when that fails it makes the tree removable (`chmod -R u+rwx`,
  `chattr -R -i -a`) and removes it with coreutils' `rm`, which walks by directory fd (any
  depth, no path length limit) and stays on one file system. It raises OSError, saying
  what is left, only when the tree is still there.
- `tree_size` is `du`: the same fd walk.

None of these follows a symbolic link out of the tree.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _unescape(field: str) -> str:
    """A mountinfo path field (spaces, tabs, newlines and backslashes are octal escapes)."""
    return field.encode().decode("unicode_escape").encode("latin-1").decode("utf-8", "surrogateescape")


def mounts_under(path: str | Path, mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Mount points at or below `path` in this process's mount namespace, deepest first (a
    point with mounts stacked on it as often as it has mounts)."""
    top = os.path.realpath(path)
    found = []
    try:
        with open(mountinfo) as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4:
                    point = _unescape(fields[4])
                    if point == top or point.startswith(top.rstrip("/") + "/"):
                        found.append(point)
    except OSError:
        return []
    return sorted(found, key=len, reverse=True)  # a point once per mount stacked on it


def detach_mounts(path: str | Path) -> list[str]:
    """Lazily unmount (MNT_DETACH: even when busy) every mount at or below `path`; the ones
    that stay (no privilege) are returned."""
    left = []
    for point in mounts_under(path):
        if _libc.umount2(point.encode("utf-8", "surrogateescape"), MNT_DETACH) != 0:
            left.append(point)
    return left


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace")


def remove_tree(path: str | Path) -> None:
    """Remove `path` and everything below it, whatever the sandbox made there (see the module
    docstring). Missing: nothing to do. OSError when something could not be removed."""
    path = Path(path)
    if not os.path.lexists(path):
        return
    stuck = detach_mounts(path)
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink()
        else:
            shutil.rmtree(path)
        return
    except FileNotFoundError:
        return
    except (OSError, RecursionError):
        pass  # deep, unreadable, immutable, ...: the thorough way
    _run("chmod", "-R", "u+rwx", "--", str(path))  # folders of mode 000 (never follows links)
    done = _run("rm", "-rf", "--one-file-system", "--", str(path))
    if os.path.lexists(path) and os.geteuid() == 0 and shutil.which("chattr"):
        _run("chattr", "-R", "-f", "-i", "-a", "--", str(path))  # slow on big trees: only when needed
        done = _run("rm", "-rf", "--one-file-system", "--", str(path))
    if os.path.lexists(path):
        why = done.stderr.strip().splitlines()[-3:] or [f"rm exited {done.returncode}"]
        if stuck:
            why.append(f"mounts that could not be detached: {stuck[:5]}")
        raise OSError(f"cannot remove {path}: {'; '.join(why)}")


def tree_size(path: str | Path) -> int:
    """Bytes the tree takes on disk (`du`: each hard-linked file once, never past a mount)."""
    done = _run("du", "-s", "-x", "-B1", "--", str(path))
    try:
        return int(done.stdout.split()[0])
    except (IndexError, ValueError):
        return 0
