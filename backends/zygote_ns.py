"""Entering a local sandbox from a forked zygote child: what bubblewrap does, in-process.

The pre-forked agent (backends/zygote.py, zygote_server.py) forks a child that calls
`unshare()` and then sets the sandbox up the way `bwrap --ro-bind / / --dev /dev --proc
/proc --tmpfs /tmp --tmpfs ROOT --bind WORK --bind RUN --unshare-pid --unshare-ipc
--unshare-uts --unshare-cgroup --unshare-net --cap-drop ALL --new-session` would:

- mounts: the whole tree made private and read-only, nosuid, nodev (`mount_setattr`,
  recursive); a fresh `/proc` of the new PID namespace with /proc/sys, sysrq-trigger, irq
  and bus read-only over it; a fresh `/dev` (null, zero, full, random, urandom, tty, a
  private devpts, shm); a private `/tmp`; the sandboxes' root hidden under a tmpfs; the
  sandbox's own work and run folders bound back writable;
- the hostname, loopback up in the new network namespace;
- every capability gone (bounding, ambient, effective, permitted, inheritable) and
  no_new_privs, so nothing the agent execs can regain one.

Python 3.11 has no os.unshare / mount: ctypes on libc. Stdlib only, Linux only, run as root
(the zygote is used only there; see zygote.py). Runs in the zygote's children, never in it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x08000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 1, 2, 4
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (new syscalls are unified)
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
# /proc files bubblewrap covers read-only: a root process without capabilities could still
# write some of them (sysrq-trigger needs none)
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus")
DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.syscall.restype = ctypes.c_long


class NamespaceError(OSError):
    """A step of the sandbox set-up failed (the message says which)."""


def _check(result: int, what: str) -> None:
    if result < 0:
        err = ctypes.get_errno()
        raise NamespaceError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None
    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {fstype or source} on {target}")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def mount_setattr(path: str, attr_set: int, attr_clr: int = 0, recursive: bool = False) -> None:
    """Per-mount flags of `path` (and every mount below it): kernel 5.12+."""
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    _check(_libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), path.encode(),
                         ctypes.c_uint(flags), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))),
           f"mount_setattr {path}")


def has_mount_setattr() -> bool:
    """True where the kernel knows mount_setattr (an empty attribute set on a bad fd: EBADF)."""
    attr = _MountAttr(0, 0, 0, 0)
    _libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(-1), b"", ctypes.c_uint(0),
                  ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    return ctypes.get_errno() != errno.ENOSYS


def prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option}")


def _bind_back(fd: int, target: str, writable: bool) -> None:
    """Bind what `fd` (an O_PATH fd opened before the covering mounts) names onto `target`."""
    os.makedirs(target, exist_ok=True)
    mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    if writable:  # a bind copies its source's read-only flag: clear it on this one mount
        mount_setattr(target, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, MOUNT_ATTR_RDONLY)


def _make_dev() -> None:
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "mode=0755")
    for name, (major, minor) in DEVICES.items():
        os.mknod(f"/dev/{name}", 0o666 | 0o020000, os.makedev(major, minor))  # S_IFCHR
        os.chmod(f"/dev/{name}", 0o666)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("core", "/proc/kcore"), ("ptmx", "pts/ptmx")):
        os.symlink(target, f"/dev/{name}")
    os.mkdir("/dev/shm", 0o1777)
    os.chmod("/dev/shm", 0o1777)
    os.mkdir("/dev/pts", 0o755)
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")


def set_up_mounts(workdir: str, rundir: str, hide: list[str], keep: list[str], workdir_at: str | None = None) -> None:
    """The sandbox's view of the file system (see the module docstring). Needs to be pid 1
    of the new PID namespace (for /proc) inside a fresh mount namespace. `workdir_at`: where
    the sandbox sees its workdir (a fork from a snapshot: at the snapshot's path, made on the
    tmpfs that hides the sandboxes' root), by default at its own path."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we do here reaches the host
    # before anything covers them: what is bound back afterwards
    back = [(os.open(p, os.O_PATH | os.O_CLOEXEC), at, w)
            for p, at, w in [*((k, k, False) for k in keep), (workdir, workdir_at or workdir, True),
                             (rundir, rundir, True)]]
    mount_setattr("/", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, recursive=True)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in PROC_READ_ONLY:
        path = f"/proc/{name}"
        if os.path.exists(path):
            mount(path, path, None, MS_BIND | MS_REC)
            mount_setattr(path, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, recursive=True)
    _make_dev()
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for path in hide:
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for fd, path, writable in back:
        _bind_back(fd, path, writable)
        os.close(fd)


def loopback_up() -> None:
    """`lo` up in a fresh network namespace (it starts down), as bubblewrap does."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Every capability, for this process and everything it execs; then no_new_privs."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        prctl(PR_CAPBSET_DROP, cap)
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    data = (_CapData * 2)()  # all zero
    _check(_libc.capset(ctypes.byref(_CapHeader(LINUX_CAPABILITY_VERSION_3, 0)), data), "capset")
    prctl(PR_SET_NO_NEW_PRIVS, 1)
