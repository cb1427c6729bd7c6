"""The Python 3.13 venv in which Harbor's own code runs (harbor needs Python >= 3.12; the host has
3.11): Debian trixie's python3.13 made portable (`orchard_gym.wrappers.harness.python`, the
mechanism the OpenHands harness uses), with `harbor==0.25.0` from PyPI and this checkout of
orchard-gym installed editable (with its docker extra), so that Harbor can load
`orchard_gym.integrations.harbor_environment:OrchardEnvironment` by import path.

    bash scripts/install_harbor.sh           # builds it once (cached; seconds once there)
    python -m orchard_gym.integrations.harbor_venv --path   # prints its bin/python

Built under $ORCHARD_CACHE/harness/venvs/, keyed by the requirements (this checkout's path among
them: an editable install belongs to one checkout).
"""

from __future__ import annotations

import sys
from pathlib import Path

HARBOR = "harbor==0.25.0"
PYTHON = "3.13"
REPO = Path(__file__).resolve().parents[2]


def requirements(repo: Path = REPO) -> list[str]:
    """harbor, and this checkout editable ("-e" and the path are two pip arguments)."""
    if not (repo / "pyproject.toml").is_file():
        raise ValueError(f"{repo} is not an orchard-gym checkout (no pyproject.toml): the Harbor venv installs "
                         f"orchard-gym editable from a checkout")
    return [HARBOR, "-e", f"{repo}[docker]"]


def harbor_python(build: bool = True, repo: Path = REPO) -> Path:
    """bin/python of the Harbor venv; built first when `build` (else HarnessInstallError if missing)."""
    from orchard_gym.wrappers.harness.install import HarnessInstallError
    from orchard_gym.wrappers.harness.python import ensure_portable_venv, venv_path

    reqs = requirements(repo)
    if build:
        return ensure_portable_venv(reqs, PYTHON) / "bin" / "python"
    venv = venv_path(reqs, PYTHON)
    if not (venv / ".ready").exists():
        raise HarnessInstallError(f"the Harbor venv ({HARBOR} on python{PYTHON}) is not built: "
                                  f"bash scripts/install_harbor.sh")
    return venv / "bin" / "python"


def main(argv: list[str]) -> int:
    if argv not in ([], ["--path"]):
        print("usage: python -m orchard_gym.integrations.harbor_venv [--path]", file=sys.stderr)
        return 2
    python = harbor_python(build=not argv)
    print(python)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
