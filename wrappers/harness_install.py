"""Installing a harness on the host, once, cached: its pip venv and its npm prefix.

Both live under the orchard cache (`$ORCHARD_CACHE`, default ~/.cache/orchard-gym), keyed
by what is installed, built under a file lock (concurrent envs wait for one build) and
marked ready only when complete, so a broken install is retried rather than reused.
Local sandboxes see the host's file system read-only, so one install serves them all.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
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
    """The npm prefix holding `packages` (pinned), installed once; its binaries are in
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
        env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false",
               "npm_config_audit": "false"}
        try:
            r = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-save", "--omit=dev", *packages],
                               capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            shutil.rmtree(prefix, ignore_errors=True)
            raise HarnessInstallError(f"npm install {' '.join(packages)} took over {timeout:g}s") from None
        if r.returncode != 0:
            shutil.rmtree(prefix, ignore_errors=True)
            raise HarnessInstallError(f"npm install {' '.join(packages)} failed: {r.stderr[-2000:]}")
        (prefix / ".ready").write_text("\n".join(packages))
    return prefix


def ensure_payload(prefix: Path, paths: list[str]) -> Path:
    """`paths` (relative to the npm prefix) as one cached .tar.gz next to the prefix: what is
    shipped into sandboxes that cannot see the host's file system (docker, kubernetes)."""
    import tarfile

    key = hashlib.sha256("\n".join(paths).encode()).hexdigest()[:12]
    archive = prefix.parent / f"{prefix.name}.payload-{key}.tar.gz"
    if archive.exists():
        return archive
    with open(prefix.parent / f"{prefix.name}.payload.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.exists():
            return archive
        partial = archive.with_suffix(".partial")
        with tarfile.open(partial, "w:gz", compresslevel=1) as tar:
            for rel in paths:
                source = prefix / rel
                if not source.exists():
                    raise HarnessInstallError(f"{rel} is not in the harness's npm prefix {prefix}")
                tar.add(source, arcname=rel)
        partial.rename(archive)
    return archive
