#!/usr/bin/env bash
# The harnesses' packages (pinned, from PyPI and npm), installed once into the orchard
# cache ($ORCHARD_CACHE, default ~/.cache/orchard-gym/harness/), which local sandboxes see
# read-only, and the archives shipped into docker/kubernetes sandboxes (an npm harness's
# `sandbox_payload`, a pip harness's whole venv). Idempotent: an install or archive already
# there is kept (each is keyed by what it holds).
# A harness with `python="X.Y"` (OpenHands: 3.13) gets its venv built on Debian's own pythonX.Y,
# bundled in the venv, from a cached `debootstrap --variant=minbase` (root; wrappers/harness_python.py).
#   bash scripts/install_harnesses.sh [NAME ...]     # default: every built-in harness
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python - "$@" <<'PY'
import sys
from orchard_gym.wrappers.harness import all_harnesses
from orchard_gym.wrappers.harness_install import ensure_payload, ensure_venv_payload

names = sys.argv[1:] or sorted(all_harnesses())
for name in names:
    h = all_harnesses()[name]
    venv, npm = h.install(), h.install_npm()
    shipped = ensure_venv_payload(venv) if venv else None
    payload = ensure_payload(npm, h.sandbox_payload) if npm and h.sandbox_payload else None
    parts = [f"{k} {v}" for k, v in (("venv", venv), ("npm", npm), ("venv archive", shipped),
                                      ("payload", payload)) if v]
    print(f"{name}: {', '.join(parts) or 'nothing to install'}")
PY
