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
# uv installs what pip would (pip's indexes, find-links and constraints: scripts/uv_pip_args.py) in
# half the time (a fresh clone's .venv with every extra: 30 s against pip's 66 s, the same
# versions). --compile-bytecode as pip does: sandboxes see the venv read-only and cannot write
# .pyc files, so without them every Python process in one compiles what it imports.
# pip does it where uv cannot be had or fails.
if .venv/bin/python -m pip install -q uv 2>/dev/null &&
   mapfile -t uv_args < <("$python" scripts/uv_pip_args.py .venv/bin/python) && ((${#uv_args[@]})) &&
   echo "[install] uv pip install -e '$spec' into .venv" &&
   .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python "${uv_args[@]}" "${torch[@]}" -e "$spec" &&
   .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python "${uv_args[@]}" --no-deps "$SWEBENCH"; then
  :
else
  echo "[install] uv could not install; pip install -e '$spec' into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  ((${#torch[@]})) && .venv/bin/python -m pip install -q "${torch[@]}"
  .venv/bin/python -m pip install -q -e "$spec"
  .venv/bin/python -m pip install -q --no-deps "$SWEBENCH"
fi
echo "$stamp" >"$stamp_file"
echo "[install] done: .venv/bin/orchard --help"
