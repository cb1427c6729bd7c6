"""Exit 0 when this interpreter's environment already holds what `scripts/install.sh EXTRAS`
would install: orchard-gym editable from this checkout, and every requirement that
pyproject.toml lists for the package and EXTRAS at a version its specifier allows.
Else print what is missing and exit 1. Lets a repeated install skip pip (~45 s).

    .venv/bin/python scripts/venv_current.py dev,server "torch==2.13.0" "swebench==5.0.2"
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


def missing(extras: list[str], more: list[str]) -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"]) + more
    for extra in extras:
        if extra not in project["optional-dependencies"]:
            return [f"unknown extra {extra!r}"]
        wanted += project["optional-dependencies"][extra]
    out = []
    for line in wanted:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            out.append(f"{req.name} (not installed)")
            continue
        if not req.specifier.contains(have, prereleases=True):
            out.append(f"{req} (have {have})")
    # an editable install points at its checkout; another checkout's venv copied here does not
    spec = importlib.util.find_spec("orchard_gym")  # found, not imported
    if spec is None or spec.origin is None:
        out.append("orchard-gym (not installed)")
    elif not Path(spec.origin).resolve().is_relative_to(REPO):
        out.append(f"orchard-gym (imported from {spec.origin}, not from {REPO})")
    return out


if __name__ == "__main__":
    extras = [e for e in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if e]
    gaps = missing(extras, sys.argv[2:])
    for gap in gaps:
        print(f"[install] needs {gap}")
    sys.exit(1 if gaps else 0)
