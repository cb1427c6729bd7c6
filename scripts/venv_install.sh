# Sourced by scripts/install.sh and install_verifiers.sh: `venv_install [--lazy-bytecode] VENV ARGS...`
# installs ARGS (pip install's) into VENV with uv where it can, else with pip.
# uv gets pip's configuration (indexes, find-links, constraints: scripts/uv_pip_args.py) and so
# installs what pip would, in a fraction of the time; --compile-bytecode as pip does (sandboxes see
# the venv read-only and cannot write .pyc files: without them every Python process in one compiles
# what it imports). --lazy-bytecode, for a venv only the host's own processes run (.venv-verifiers):
# no compiling of every module up front (12 s of a 15 s install here); each module is compiled
# when first imported, and its .pyc kept (unless PYTHONDONTWRITEBYTECODE is set).
venv_install() {
  local compile=(--compile-bytecode) pip_compile=() uv_args=()
  if [[ $1 == --lazy-bytecode ]]; then compile=() pip_compile=(--no-compile); shift; fi
  local venv=$1
  shift
  if { [[ -x $venv/bin/uv ]] || "$venv/bin/python" -m pip install -q uv 2>/dev/null; } &&
     mapfile -t uv_args < <("${PYTHON:-python3}" scripts/uv_pip_args.py "$venv/bin/python") && ((${#uv_args[@]})) &&
     "$venv/bin/uv" pip install -q "${compile[@]}" --python "$venv/bin/python" "${uv_args[@]}" "$@"; then
    return 0
  fi
  echo "[install] uv could not install into $venv; pip install $*" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip && "$venv/bin/python" -m pip install -q "${pip_compile[@]}" "$@"
}
