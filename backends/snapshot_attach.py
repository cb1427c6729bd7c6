"""Giving a running local sandbox a snapshot's files: how a warm pool serves a fork.

A pooled sandbox is already running (its agent answers, its namespaces exist), so a fork
from it costs no start: the backend mounts the snapshot's overlay in the host's namespace
(layers.py) and attaches copies of that mount inside the sandbox's own mount namespace, at
its workdir and at the snapshot's path (so absolute paths written before the snapshot hold).

The attach runs in a short-lived thread of the backend (root) that leaves the process's
shared filesystem context (`unshare(CLONE_FS)`) and enters the sandbox's mount namespace
(`setns`), then `move_mount`s detached clones of the overlay (`open_tree(OPEN_TREE_CLONE)`):
no process or binary of the sandbox takes part, and it happens before the sandbox is
handed to anyone (an untouched pooled sandbox). The agent resolves its working directory
by path for every command, so the next command already runs in the overlay.

Linux 5.2+ (open_tree, move_mount); root.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading

from .zygote_ns import MOUNT_ATTR_RDONLY, MS_BIND, NamespaceError, mount, mount_setattr

SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429  # unified numbers (kernel 5.2)
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_RECURSIVE = 1, 0o2000000, 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
CLONE_FS, CLONE_NEWNS = 0x200, 0x00020000
AT_FDCWD = -100

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise NamespaceError(err, f"{what}: {os.strerror(err)}")
    return result


def _open_tree(path: str) -> int:
    return _check(_libc.syscall(ctypes.c_long(SYS_OPEN_TREE), ctypes.c_int(AT_FDCWD), path.encode(),
                                ctypes.c_uint(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)),
                  f"open_tree {path}")


def _move_mount(fd: int, target: str) -> None:
    _check(_libc.syscall(ctypes.c_long(SYS_MOVE_MOUNT), ctypes.c_int(fd), b"", ctypes.c_int(AT_FDCWD),
                         target.encode(), ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH)), f"move_mount onto {target}")


def _mkdirs(path: str) -> None:
    """The folder inside the sandbox; its root is read-only: lifted for the mkdir alone."""
    try:
        os.makedirs(path, exist_ok=True)
        return
    except OSError as e:
        if e.errno != errno.EROFS:
            raise
    mount_setattr("/", 0, MOUNT_ATTR_RDONLY)
    try:
        os.makedirs(path, exist_ok=True)
    finally:
        mount_setattr("/", MOUNT_ATTR_RDONLY)


def attach(pid: int, source: str, targets: list[str]) -> None:
    """Attach clones of the mount at `source` (host) on each of `targets` inside the mount
    namespace of process `pid` (a sandbox's pid 1). NamespaceError/OSError on failure."""
    fds = [_open_tree(source) for _ in targets]
    ns_fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            _check(_libc.unshare(ctypes.c_int(CLONE_FS)), "unshare(CLONE_FS)")  # this thread alone
            _check(_libc.setns(ctypes.c_int(ns_fd), ctypes.c_int(CLONE_NEWNS)), "setns into the sandbox")
            for fd, target in zip(fds, targets):
                _mkdirs(target)
                _move_mount(fd, target)
        except BaseException as e:  # raised in the caller's thread below
            failed.append(e)

    try:
        thread = threading.Thread(target=run, name="orchard-attach")  # ends here: its namespace goes with it
        thread.start()
        thread.join()
    finally:
        for fd in [*fds, ns_fd]:
            os.close(fd)
    if failed:
        raise failed[0]



def load_into(store, meta: dict, snapshot_id: str) -> dict:
    """Mount `snapshot_id`'s files (a LocalSnapshotStore `store`) on the workdir of the untouched
    running sandbox of `meta`: in the host's view an overlay stacked on ROOT/<id>/work (its
    upper in the workdir's own file system, reached through ROOT/<id>/rw), and with
    namespaces in the sandbox's too. Returns the keys to add to its meta."""
    work = meta["workdir"]
    home = os.path.dirname(work)
    rw = os.path.join(home, "rw")
    with os.scandir(work) as entries:
        if any(True for _ in entries):
            raise ValueError("only an untouched sandbox (an empty workdir) can take a snapshot's files")
    os.mkdir(rw, 0o700)
    mount(work, rw, None, MS_BIND)  # the workdir's file system, reachable once the overlay covers it
    from pathlib import Path

    try:
        source = store.restore(snapshot_id, Path(work), Path(rw), meta["sandbox_id"])
    except BaseException:
        _libc.umount2(rw.encode(), 2)
        os.rmdir(rw)
        raise
    added = {"layers": source["layers"], "upper": source["upper"]}
    if meta["isolation"] == "bwrap":
        inside = meta.get("sandbox_workdir", work)
        try:
            attach(meta["pid"]["pid"], work, list(dict.fromkeys([inside, source["workdir"]])))
        except BaseException:
            for point in (work, rw):
                _libc.umount2(point.encode(), 2)
            store.release_sandbox({**meta, **added})
            raise
        added["also_at"] = source["workdir"]  # the snapshot's path, where absolute paths in its files point
    return added
