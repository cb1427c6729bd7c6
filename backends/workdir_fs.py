"""A size-capped workdir for a local sandbox: an ext4 image of its own, loop-mounted.

Without it a sandbox's workdir is a folder on the host's disk, and a policy can fill that
disk. The image is sparse (`ROOT/<id>/work.img`, inside the folder bubblewrap hides), so it
takes only what is written, up to `size`; past that, writes fail with ENOSPC inside the
sandbox alone. mkfs runs once per backend root and size (`ROOT/.workdir-<size>.img`); a
create copies that template's few MB of metadata and mounts the copy
(scripts/bench_local_limits.py measures the cost). A tmpfs would be cheaper but holds host
memory; project quotas need a file system mounted with them.

Root only (loop devices and mounts); `unavailable_reason()` says why not elsewhere, and the
backend then records the workdir as unlimited (`enforced_by`). A deleted sandbox's image is
detached lazily: sandboxes started while it existed hold it (hidden) in their mount
namespace until they end.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import subprocess
import threading
from pathlib import Path

from orchard_gym.backends.zygote_ns import mount
from orchard_gym.errors import BackendError

# no journal (a sandbox's files need no crash safety), nothing reserved for root, the
# metadata initialised lazily: the image costs ~4 MB and mkfs ~10 ms whatever its size
MKFS_OPTIONS = ["-q", "-F", "-O", "^has_journal", "-m", "0", "-E", "lazy_itable_init=1,nodiscard"]


def _path() -> str:
    return os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"


def unavailable_reason() -> str | None:
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices (/dev/loop-control)"
    if os.geteuid() != 0:
        return "not root (loop mounts need it)"
    missing = [t for t in ("mkfs.ext4", "mount")
               if not any(os.access(os.path.join(d, t), os.X_OK) for d in _path().split(":") if d)]
    return f"{', '.join(missing)} not installed" if missing else None


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PATH": _path()})
    if done.returncode != 0:
        raise BackendError(f"cannot make the sandbox's size-capped workdir ({argv[0]}): {done.stderr.strip()[-300:]}")


def _template(folder: Path, size: int) -> Path:
    """A fresh ext4 image of `size` bytes, made once per size in `folder` (a dot-name: the
    backend's sweep and list pass it by); each sandbox gets a copy, so mkfs (tens of ms, an
    fsync) runs once."""
    template = folder / f".workdir-{size}.img"
    if not template.exists():
        tmp = folder / f".workdir-{size}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as f:
            f.truncate(size)
        try:
            _run(["mkfs.ext4", *MKFS_OPTIONS, str(tmp)])
            os.replace(tmp, template)  # whole or not at all; a racing maker's is as good
        finally:
            tmp.unlink(missing_ok=True)
    return template


def _copy_sparse(src: Path, dst: Path) -> None:
    """Copy `src` keeping its holes: only the extents with data (~4 MB of a fresh image)."""
    with open(src, "rb") as s, open(dst, "wb") as d:
        end = os.fstat(s.fileno()).st_size
        d.truncate(end)
        offset = 0
        while offset < end:
            try:
                offset = os.lseek(s.fileno(), offset, os.SEEK_DATA)
            except OSError:  # ENXIO: no data past offset
                break
            stop = os.lseek(s.fileno(), offset, os.SEEK_HOLE)
            while offset < stop:
                offset += os.copy_file_range(s.fileno(), d.fileno(), stop - offset, offset, offset)


LOOP_CTL_GET_FREE, LOOP_CONFIGURE, LOOP_CLR_FD = 0x4C82, 0x4C0A, 0x4C01
LO_FLAGS_AUTOCLEAR = 4  # the loop device goes when its last mount does, as `mount -o loop` sets it
MS_NOSUID, MS_NODEV = 2, 4
MOUNT_OPTIONS = "noinit_itable"


class _LoopInfo64(ctypes.Structure):
    _fields_ = [("lo_device", ctypes.c_uint64), ("lo_inode", ctypes.c_uint64), ("lo_rdevice", ctypes.c_uint64),
                ("lo_offset", ctypes.c_uint64), ("lo_sizelimit", ctypes.c_uint64), ("lo_number", ctypes.c_uint32),
                ("lo_encrypt_type", ctypes.c_uint32), ("lo_encrypt_key_size", ctypes.c_uint32),
                ("lo_flags", ctypes.c_uint32), ("lo_file_name", ctypes.c_uint8 * 64),
                ("lo_crypt_name", ctypes.c_uint8 * 64), ("lo_encrypt_key", ctypes.c_uint8 * 32),
                ("lo_init", ctypes.c_uint64 * 2)]


class _LoopConfig(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_uint32), ("block_size", ctypes.c_uint32), ("info", _LoopInfo64),
                ("reserved", ctypes.c_uint64 * 8)]


def _loop_mount(image: Path, mountpoint: Path) -> bool:
    """`mount -o loop` without the mount binary (its fork and exec were ~7 of the ~10 CPU-ms
    a workdir cost): a free loop device bound to the image (LOOP_CONFIGURE, kernel 5.8+,
    autoclear) and mount(2). False where this way is not available (old kernel, no
    /dev/loopN node): the caller runs mount(8) instead. OSError: the mount itself failed."""
    for _ in range(20):  # another process may take the free device between the two calls
        try:
            with open("/dev/loop-control", "rb", buffering=0) as ctl:
                number = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
            device = f"/dev/loop{number}"
            dev_fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            img_fd = os.open(image, os.O_RDWR | os.O_CLOEXEC)
            try:
                config = _LoopConfig(fd=img_fd)
                config.info.lo_flags = LO_FLAGS_AUTOCLEAR
                name = str(image).encode()[:63]
                ctypes.memmove(config.info.lo_file_name, name, len(name))
                try:
                    fcntl.ioctl(dev_fd, LOOP_CONFIGURE, config)
                except OSError as e:
                    if e.errno == errno.EBUSY:
                        continue
                    return False  # EINVAL/ENOTTY: a kernel before LOOP_CONFIGURE
            finally:
                os.close(img_fd)
            try:
                mount(device, str(mountpoint), "ext4", MS_NOSUID | MS_NODEV, MOUNT_OPTIONS)
            except OSError:
                fcntl.ioctl(dev_fd, LOOP_CLR_FD)  # autoclear needs a mount to have been made
                raise
            return True
        finally:
            os.close(dev_fd)
    return False


def make(image: Path, mountpoint: Path, size: int) -> None:
    """Give the sandbox a sparse ext4 image of `size` bytes (a copy of the root's template)
    mounted on `mountpoint` (an existing empty folder), which is left empty (no lost+found)."""
    _copy_sparse(_template(image.parent.parent, size), image)
    # noinit_itable: the image is sparse, so the inode tables mkfs left unwritten read as
    # zeros already; the kernel would otherwise write them all in the background
    try:
        mounted = _loop_mount(image, mountpoint)
    except OSError as e:
        raise BackendError(f"cannot make the sandbox's size-capped workdir (mount): {e}") from None
    if not mounted:
        _run(["mount", "-t", "ext4", "-o", f"loop,nosuid,nodev,{MOUNT_OPTIONS}", str(image), str(mountpoint)])
    try:
        os.rmdir(mountpoint / "lost+found")
    except OSError:
        pass
