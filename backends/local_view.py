"""What a local sandbox sees of the host's file system: one plan, run by both spawners.

A sandbox's root is an empty, read-only tmpfs holding only:

- the userland, read-only: `/usr` and the top-level links or folders beside it (`/bin`,
  `/lib64`, ...), and `/etc` with every secret covered (shadow files, sudoers, TLS and SSH
  private keys, and anything an unprivileged host user could not read either);
- `/proc` (its own PID namespace), a minimal `/dev`, a private `/tmp`;
- the shares, read-only at their host paths: the interpreter and the agent's code, and what
  the envs keep for sandboxes in the orchard cache (test venvs, harness installs, MiniWoB's
  pages, the recording proxies' sockets), plus `LocalBackendConfig.read_only_paths`;
- the sandbox's own work and run folders, writable.

Nothing else: no `/var`, `/srv`, `/run`, `/home`, `/root`, `/opt`, no project checkout, no
backend root (so no other sandbox, meta.json or agent socket) and no host unix socket but the
proxies' in the cache. The plan is a list of steps (`["ro", path]`, ...): local.py turns
it into a bubblewrap command line, zygote_ns.py runs it in-process.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# the userland: bound read-only where a folder, re-made where a link (/bin -> usr/bin)
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
# secrets in /etc whatever their mode (paths relative to /etc; a folder covers all below it)
ETC_SECRETS = ("shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "sudoers.d", "ssl/private",
               "security/opasswd", "ssh", "machine-id", "credstore", "credstore.encrypted", "wireguard",
               "NetworkManager/system-connections", "libvirt/secrets", "cups/ssl")
# /etc links whose target lives outside the view and is needed there (systemd-resolved's
# resolv.conf points into /run): the target file alone is bound at its own path
ETC_LINKS_KEPT = ("resolv.conf",)
# what sandboxes use of the orchard cache ($ORCHARD_CACHE): never its other entries (AgentDojo
# suite dumps hold the ground truths)
CACHE_SHARES = ("swe/venvs", "claw/venvs", "harness", "gui", "run")
KINDS = {"symlink": 2, "ro": 1, "cover-dir": 1, "cover-file": 1, "proc": 1, "dev": 1, "tmpfs": 1}


def cache_shares() -> list[Path]:
    """The orchard cache's folders every local sandbox may read (made here if missing, so a
    venv or socket made after a sandbox started still shows up in it)."""
    from orchard_gym.cache import cache_root

    out = []
    for rel in CACHE_SHARES:
        path = cache_root() / rel
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue  # a read-only home: nothing there to share
        out.append(path)
    return out


def _public(st: os.stat_result) -> bool:
    """Readable by any host user (a folder: listable and enterable)."""
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(st.st_mode) else 0)
    return st.st_mode & need == need


def etc_covers(etc: str = "/etc") -> list[list[str]]:
    """Steps covering what the sandbox must not read in /etc: the named secrets, anything
    not world-readable, and sockets or devices (nothing to reach through /etc)."""
    covers = []
    secrets = {os.path.join(etc, s) for s in ETC_SECRETS}
    for top, dirs, files in os.walk(etc):
        for name in sorted(dirs) + sorted(files):
            path = os.path.join(top, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                continue  # its target is covered or outside the view
            is_dir = stat.S_ISDIR(st.st_mode)
            if path in secrets or not _public(st) or not (is_dir or stat.S_ISREG(st.st_mode)):
                covers.append(["cover-dir" if is_dir else "cover-file", path])
                if is_dir:
                    dirs.remove(name)
    return covers


def _kept_link_targets(etc: str = "/etc") -> list[list[str]]:
    out = []
    for name in ETC_LINKS_KEPT:
        target = os.path.realpath(os.path.join(etc, name))
        if os.path.islink(os.path.join(etc, name)) and not _inside(target, ("/usr", etc, "/proc")) \
                and os.path.isfile(target):
            out.append(["ro", target])
    return out


def _inside(path: str, folders) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def plan(shares: list[str], root: str) -> list[list[str]]:
    """The steps making a sandbox's view, in order (see the module docstring). `shares`: host
    paths bound read-only at their own path; `root`: the backend's sandboxes, covered where a
    share holds it. The work and run folders are bound after these by the spawner."""
    steps: list[list[str]] = []
    for path in SYSTEM:
        if os.path.islink(path):
            steps.append(["symlink", os.readlink(path), path])
        elif os.path.isdir(path):
            steps.append(["ro", path])
    steps += etc_covers() + _kept_link_targets()
    steps += [["proc", "/proc"], ["dev", "/dev"], ["tmpfs", "/tmp"]]
    kept: list[str] = []
    for share in sorted(set(map(os.path.realpath, shares))):  # a folder before what lies in it
        if os.path.exists(share) and not _inside(share, kept) and not _inside(share, ("/usr", "/etc")):
            kept.append(share)
            steps.append(["ro", share])
    if any(_inside(root, (share,)) for share in kept):  # never another sandbox through a share
        steps.append(["tmpfs", root])  # writable: the spawner makes the work and run folders in it
    return steps


def check_steps(steps) -> list[list[str]]:
    """The steps as plan() makes them, or ValueError (the zygote checks what it is sent)."""
    if not isinstance(steps, list):
        raise ValueError("the view is a list of steps")
    for step in steps:
        if not (isinstance(step, list) and step and step[0] in KINDS and len(step) == 1 + KINDS[step[0]]
                and all(isinstance(s, str) and s and "\0" not in s for s in step)):
            raise ValueError(f"bad view step {str(step)[:200]}")
        path = step[-1]
        if not path.startswith("/") or os.path.normpath(path) != path or path == "/":
            raise ValueError(f"view step {step[0]}: {path[:200]!r} is not a normalised absolute path below /")
    return steps


def bwrap_args(steps: list[list[str]]) -> list[str]:
    """The plan as bubblewrap options (before the work and run binds)."""
    argv: list[str] = []
    for kind, *args in steps:
        if kind == "symlink":
            argv += ["--symlink", args[0], args[1]]
        elif kind == "ro":
            argv += ["--ro-bind", args[0], args[0]]
        elif kind == "cover-file":
            argv += ["--ro-bind", "/dev/null", args[0]]  # bwrap's binds are nodev: opening it fails
        elif kind == "cover-dir":
            argv += ["--tmpfs", args[0], "--remount-ro", args[0]]
        else:
            argv += [f"--{kind}", args[0]]
    return argv
