"""A size-capped workdir for a local sandbox: an ext4 image of its own, loop-mounted.

Without it a sandbox's workdir is a folder on the host's disk, and a policy can fill that
disk. The image is sparse (`ROOT/<id>/work.img`, inside the folder bubblewrap hides), so it
takes only what is written, up to `size`; past that, writes fail with ENOSPC inside the
sandbox alone. Measured on a 2-core VM: mkfs + mount about 25 ms per create, umount + rm
about 5 ms per delete. A tmpfs would be cheaper but holds host memory; project quotas need
a file system mounted with them.

Root only (loop devices and mounts); `unavailable_reason()` says why not elsewhere, and the
backend then records the workdir as unlimited (`enforced_by`). A deleted sandbox's image is
detached lazily: sandboxes started while it existed hold it (hidden) in their mount
namespace until they end.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

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


def make(image: Path, mountpoint: Path, size: int) -> None:
    """Create the sparse image of `size` bytes, an ext4 on it, and mount it on `mountpoint`
    (an existing empty folder), which is left empty (no lost+found)."""
    with open(image, "wb") as f:
        f.truncate(size)
    for argv in (["mkfs.ext4", *MKFS_OPTIONS, str(image)],
                 ["mount", "-t", "ext4", "-o", "loop,nosuid,nodev", str(image), str(mountpoint)]):
        done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PATH": _path()})
        if done.returncode != 0:
            raise BackendError(f"cannot make the sandbox's size-capped workdir ({argv[0]}): "
                               f"{done.stderr.strip()[-300:]}")
    try:
        os.rmdir(mountpoint / "lost+found")
    except OSError:
        pass
