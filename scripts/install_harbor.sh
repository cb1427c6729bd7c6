#!/usr/bin/env bash
# Harbor's own runner (harbor==0.25.0, PyPI) in a Python 3.13 venv: Debian trixie's python3.13,
# bundled the way the OpenHands harness's is (wrappers/harness/python.py; the trixie minbase is
# shared with it), with this checkout of orchard-gym installed editable, so that `harbor run
# --env orchard_gym.integrations.harbor_environment:OrchardEnvironment` runs trials in Orchard
# sandboxes (docs/harbor.md). Idempotent: built once per checkout, seconds once there.
# Prints the venv's bin/python.
#   bash scripts/install_harbor.sh
set -euo pipefail
cd "$(dirname "$0")/.."
echo "[harbor] harbor==0.25.0 on Debian's python3.13 (minutes the first time, seconds once there)" >&2
exec .venv/bin/python -m orchard_gym.integrations.harbor_venv
