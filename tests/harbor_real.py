"""Harbor's real package (harbor==0.25.0, in the Python 3.13 venv scripts/install_harbor.sh builds)
for the tests: its interpreter, its `harbor` CLI, and scripts/harbor_check.py (TaskConfig, ATIF
Trajectory) run with it. Missing venv: the test is skipped, or FAILS under ORCHARD_REQUIRE
(harbor, or all), as CI runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from components import require

REPO = Path(__file__).resolve().parents[1]


def harbor_python() -> Path:
    from orchard_gym.integrations.harbor_venv import harbor_python as find
    from orchard_gym.wrappers.harness.install import HarnessInstallError

    try:
        return find(build=False)
    except HarnessInstallError as e:
        require("harbor", str(e))
        raise


def harbor_env() -> dict[str, str]:
    """The environment Harbor runs in here: no telemetry (offline), the engine's socket kept."""
    return {**os.environ, "HARBOR_TELEMETRY": "0"}


def harbor_check(kind: str, target: Path) -> tuple[int, str]:
    """scripts/harbor_check.py with Harbor's own models: (exit status, one line per item)."""
    r = subprocess.run([str(harbor_python()), str(REPO / "scripts" / "harbor_check.py"), kind, str(target)],
                       capture_output=True, text=True, timeout=300, env=harbor_env(), cwd=REPO)
    return r.returncode, r.stdout + r.stderr
