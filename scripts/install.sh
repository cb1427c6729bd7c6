#!/usr/bin/env bash
# Install orchard-gym into ./.venv (idempotent). Extras as arguments, e.g.
#   bash scripts/install.sh            # the package: local backend, SDK, CLI
#   bash scripts/install.sh dev,server # plus what the tests and the orchestrator need
# ORCHARD_LAZY_BYTECODE=1: no compiling of every module up front (scripts/test.sh: .venv is only ever
# run by this host's own processes, which write each .pyc when they first import the module).
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

# the CPU build lying on this machine's disk; an unpinned torch pulls a multi-GB CUDA build
TORCH="torch==2.13.0"
# SWE-bench's grading, without the harness's docker/modal/datasets dependencies
# (envs/swe/grading.py imports only the pure modules it needs)
SWEBENCH="swebench==5.0.2"
pins=("$SWEBENCH")
[[ ",$extras," == *",train,"* ]] && pins+=("$TORCH")

# Nothing to do (pip takes ~45 s even then) when the last install here was of this very
# pyproject.toml and these extras, and every requirement is still met from this checkout.
stamp_file=.venv/.orchard-install-stamp
stamp=$(cat pyproject.toml "$0" | sha256sum | cut -d' ' -f1)-$extras
if [[ -x .venv/bin/python && -f $stamp_file && $(<"$stamp_file") == "$stamp" ]] &&
   .venv/bin/python scripts/venv_current.py "$extras" "${pins[@]}"; then
  echo "[install] .venv is current (pyproject.toml, extras '$extras'): nothing to install"
  exit 0
fi

python=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
rm -f "$stamp_file"
spec="."
[[ -n $extras ]] && spec=".[$extras]"
torch=()
[[ ",$extras," == *",train,"* ]] && torch=("$TORCH")
source scripts/venv_install.sh   # uv with pip's configuration where it can, else pip
echo "[install] install -e '$spec' into .venv"
lazy=()
[[ ${ORCHARD_LAZY_BYTECODE:-} == 1 ]] && lazy=(--lazy-bytecode)
venv_install "${lazy[@]}" .venv "${torch[@]}" -e "$spec"
venv_install "${lazy[@]}" .venv --no-deps "$SWEBENCH"
echo "$stamp" >"$stamp_file"
echo "[install] done: .venv/bin/orchard --help"
