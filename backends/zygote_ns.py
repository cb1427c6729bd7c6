"""Entering a local sandbox from a forked zygote child: what bubblewrap does, in-process.

The pre-forked agent (backends/zygote.py, zygote_server.py) forks a child that calls
`unshare()` and then sets the sandbox up the way `bwrap VIEW --bind WORK --bind RUN
--remount-ro / --unshare-pid --unshare-ipc --unshare-uts --unshare-cgroup --unshare-net
--cap-drop ALL --new-session` would (VIEW: local_view.plan()'s steps):

- mounts: a new root, a tmpfs made read-only at the end, holding only the view's steps: its
  read-only binds (nosuid, nodev, `mount_setattr` recursive), links and covers; a fresh
  `/proc` of the new PID namespace with /proc/sys, sysrq-trigger, irq and bus read-only over
  it; a fresh `/dev` (null, zero, full, random, urandom, tty, a private devpts, shm); a
  private `/tmp`; the sandbox's own work and run folders bound writable; then `pivot_root`
  into it, the host's tree detached;
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
MNT_DETACH = 2
# pivot_root has no libc wrapper; an old syscall, so its number differs by architecture
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}.get(os.uname().machine)
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
    """Bind what `fd` (an O_PATH fd opened before the covering mounts) names onto `target`,
    read-only (and nosuid, nodev) unless `writable`."""
    source = f"/proc/self/fd/{fd}"
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    elif not os.path.lexists(target):  # a file is mounted on a file
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o444))
    mount(source, target, None, MS_BIND | MS_REC)
    if writable:  # a bind copies its source's read-only flag: clear it on this one mount
        mount_setattr(target, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, MOUNT_ATTR_RDONLY)
    else:
        mount_setattr(target, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, recursive=True)


def _make_dev(dev: str) -> None:
    mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=0755")
    for name, (major, minor) in DEVICES.items():
        os.mknod(f"{dev}/{name}", 0o666 | 0o020000, os.makedev(major, minor))  # S_IFCHR
        os.chmod(f"{dev}/{name}", 0o666)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("core", "/proc/kcore"), ("ptmx", "pts/ptmx")):
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm", 0o1777)
    os.chmod(f"{dev}/shm", 0o1777)
    os.mkdir(f"{dev}/pts", 0o755)
    mount("devpts", f"{dev}/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")


def _make_proc(proc: str) -> None:
    mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in PROC_READ_ONLY:
        path = f"{proc}/{name}"
        if os.path.exists(path):
            mount(path, path, None, MS_BIND | MS_REC)
            mount_setattr(path, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, recursive=True)


def _tmpfs(path: str, mode: str, read_only: bool = False, size: int | None = None) -> None:
    os.makedirs(path, exist_ok=True)
    mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode}" + (f",size={size}" if size else ""))
    if read_only:
        mount_setattr(path, MOUNT_ATTR_RDONLY)


def pivot_root(new_root: str) -> None:
    """Make `new_root` (a mount point) this mount namespace's root; the old tree is detached."""
    if SYS_PIVOT_ROOT is None:
        raise NamespaceError(errno.ENOSYS, f"pivot_root: no syscall number known for {os.uname().machine}")
    os.chdir(new_root)
    _check(_libc.syscall(ctypes.c_long(SYS_PIVOT_ROOT), b".", b"."), "pivot_root")  # pivot_root(2)'s idiom
    _check(_libc.umount2(b".", MNT_DETACH), "detach the host's tree")
    os.chdir("/")


def set_up_mounts(workdir: str, rundir: str, view: list[list[str]], workdir_at: str | None = None,
                  tmp_size: int | None = None) -> None:
    """The sandbox's view of the file system (see the module docstring; `view`:
    local_view.plan()'s steps, checked). Needs to be pid 1 of the new PID namespace (for
    /proc) inside a fresh mount namespace. `workdir_at`: where the sandbox sees its workdir
    (a fork from a snapshot: at the snapshot's path), by default at its own path. `tmp_size`:
    bytes of the sandbox's /tmp (None: unbounded but for the memory cgroup)."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we do here reaches the host
    # before anything covers them (the new root is staged on /tmp): every source
    opened = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in
              ["/dev/null", workdir, rundir, *(s[1] for s in view if s[0] == "ro")]}
    new = "/tmp"  # as bubblewrap: a tmpfs on the host's /tmp (in this namespace only) becomes "/"
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for kind, *args in view:
        at = new + args[-1]
        if kind == "symlink":
            os.makedirs(os.path.dirname(at), exist_ok=True)
            os.symlink(args[0], at)
        elif kind in ("ro", "cover-file"):  # a file covered by /dev/null on a nodev mount: unreadable
            _bind_back(opened[args[0] if kind == "ro" else "/dev/null"], at, writable=False)
        elif kind == "cover-dir":
            _tmpfs(at, "0755", read_only=True)
        elif kind == "tmpfs":
            _tmpfs(at, "1777", size=tmp_size if args[-1] == "/tmp" else None)
        elif kind == "proc":
            os.makedirs(at, exist_ok=True)
            _make_proc(at)
        elif kind == "dev":
            os.makedirs(at, exist_ok=True)
            _make_dev(at)
    _bind_back(opened[workdir], new + (workdir_at or workdir), writable=True)
    _bind_back(opened[rundir], new + rundir, writable=True)
    for fd in opened.values():
        os.close(fd)
    pivot_root(new)
    mount_setattr("/", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)  # the root itself, not below


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
