"""Cached virtual environments with a task's test dependencies, built on the host.

Local sandboxes see the cache's venv folders read-only (backends/local_view.py), so one venv
per distinct set of requirements serves every sandbox of every task that needs it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from orchard_gym.cache import cache_root
from orchard_gym.pip_install import pip_install


def ensure_venv(requirements: list[str], root: Path | None = None) -> Path:
    """Return a venv with `requirements` installed, building it once (under a lock)."""
    python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    key = hashlib.sha256(("\n".join([python, *sorted(requirements)])).encode()).hexdigest()[:16]
    root = root or cache_root() / "swe" / "venvs"
    venv = root / key
    if (venv / ".ready").exists():
        return venv
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # other processes building the same venv wait here
        if (venv / ".ready").exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True, capture_output=True)
        if requirements:
            r = pip_install(str(venv / "bin" / "python"), requirements)
            if r.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                raise RuntimeError(f"cannot build the test venv ({' '.join(requirements)}): {r.stderr[-2000:]}")
        (venv / ".ready").write_text("\n".join(requirements))
    return venv
