#!/usr/bin/env bash
# .venv-verifiers: orchard-gym (editable, this checkout) with the extras [verifiers,docker,gui] in a venv of
# its own. verifiers 0.4 pins mcp==2.0.0 (imported by `verifiers.v1`), OpenEnv 0.10 needs mcp<2,
# so they cannot share .venv (docs/integrations.md). Idempotent: a venv installed from this very
# pyproject.toml and script is kept (a second run takes a second). The first run takes ~15 s (uv)
# and ~600 MB; it also warms uv's cache with verifiers' chat program's packages (its null
# harness runs that program through `uv`), so episodes start without a download.
#   bash scripts/install_verifiers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-verifiers
stamp_file=$venv/.orchard-install-stamp
stamp=$(cat pyproject.toml "$0" | sha256sum | cut -d' ' -f1)-$PWD
if [[ -x $venv/bin/vf-eval && -f $stamp_file && $(<"$stamp_file") == "$stamp" ]] &&
   [[ $($venv/bin/python -c 'import orchard_gym, os; print(os.path.dirname(os.path.dirname(orchard_gym.__file__)))') == "$PWD" ]]; then
  echo "[verifiers] $venv is current: nothing to install"
  exit 0
fi
echo "[verifiers] install -e '.[verifiers,docker,gui]' into $venv (uv: seconds; pip: about a minute)"
python=${PYTHON:-python3}
[[ -x $venv/bin/python ]] || "$python" -m venv "$venv"
rm -f "$stamp_file"
# docker: GUI-v0 (and any env) on the docker backend; gui: MiniWoB's pages for GUI-v0's task list;
# SWE-bench's grading, installed as scripts/install.sh does (its pin is read from there).
source scripts/venv_install.sh
venv_install --lazy-bytecode "$venv" -e '.[verifiers,docker,gui]'
venv_install --lazy-bytecode "$venv" --no-deps "$(grep -o 'swebench==[0-9.]*' scripts/install.sh | head -1)"
script=$(mktemp -d)/chat.py
$venv/bin/python -c "from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE as s; print(s, end='')" >"$script"
PATH="$PWD/$venv/bin:$PATH" uv sync --script "$script" -q --no-config
rm -rf "$(dirname "$script")"
echo "$stamp" >"$stamp_file"
echo "[verifiers] done: $venv/bin/vf-eval orchard-verifiers --env.taskset.env Orchard/Claw-v0 ... (docs/integrations.md)"
