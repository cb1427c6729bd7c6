#!/usr/bin/env bash
# Install orchard-gym into ./.venv (idempotent). Extras as arguments, e.g.
#   bash scripts/install.sh            # the package: local backend, SDK, CLI
#   bash scripts/install.sh dev,server # plus what the tests and the orchestrator need
# As root on Debian/Ubuntu it also installs bubblewrap, which gives local sandboxes
# their own PID, mount and network namespaces (without it they are plain processes).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-}

if ! command -v bwrap >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "[install] installing bubblewrap"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap git
  else
    echo "[install] bubblewrap not found and cannot install it here: sandboxes will run without namespaces" >&2
  fi
fi

python=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if [[ ",$extras," == *",train,"* ]]; then
  # the CPU build lying on this machine's disk; an unpinned torch pulls a multi-GB CUDA build
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
spec="."
[[ -n $extras ]] && spec=".[$extras]"
echo "[install] pip install -e '$spec' into .venv"
.venv/bin/python -m pip install -q -e "$spec"
# SWE-bench's grading, without the harness's docker/modal/datasets dependencies
# (envs/swe/grading.py imports only the pure modules it needs)
.venv/bin/python -m pip install -q --no-deps "swebench==5.0.2"
echo "[install] done: .venv/bin/orchard --help"
