#!/usr/bin/env bash
# The harnesses' packages (pinned, from PyPI and npm), installed once into the orchard
# cache ($ORCHARD_CACHE, default ~/.cache/orchard-gym/harness/), which local sandboxes see
# read-only. Idempotent: an install already there is kept (each is keyed by what it holds).
#   bash scripts/install_harnesses.sh [NAME ...]     # default: every built-in harness
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python - "$@" <<'PY'
import sys
from orchard_gym.wrappers.harness import all_harnesses

names = sys.argv[1:] or sorted(all_harnesses())
for name in names:
    h = all_harnesses()[name]
    venv, npm = h.install(), h.install_npm()
    parts = [f"{k} {v}" for k, v in (("venv", venv), ("npm", npm)) if v]
    print(f"{name}: {', '.join(parts) or 'nothing to install'}")
PY
