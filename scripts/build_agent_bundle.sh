#!/usr/bin/env bash
# Usage: build_agent_bundle.sh OUT_DIR
# Builds a self-contained, relocatable runtime for the stdlib-only agent
# (the folder orchard_gym/agent, override with AGENT_SRC=...) that runs in images with
# no Python and no glibc, from a READ-ONLY mount. Layout and argv: docs/agent_bundle.md.
#
# Approach: Debian's /usr/bin/python3.11 (libpython linked statically) + a
# trimmed stdlib with precompiled .pyc + every shared library that ldd reports
# for it and for the kept extension modules + glibc's dynamic loader. The
# loader is run explicitly with --library-path, so nothing is looked up in the
# container's /lib and nothing (no LD_LIBRARY_PATH) leaks into child processes.
#
# Idempotent: the runtime is rebuilt only when its stamp (this script, the
# interpreter binary, package versions) changes; the agent is re-copied every run.
set -euo pipefail

log() { echo "[build_agent_bundle] $*"; }
die() { echo "[build_agent_bundle] ERROR: $*" >&2; exit 1; }

[[ $# -eq 1 ]] || die "usage: $0 OUT_DIR"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$(mkdir -p "$1" && cd "$1" && pwd)
[[ $OUT != / ]] || die "refusing OUT_DIR=/ (the build deletes OUT_DIR/bin and OUT_DIR/lib)"
AGENT_SRC=${AGENT_SRC:-$REPO/orchard_gym/agent}   # the agent: a folder of stdlib-only modules
PY=/usr/bin/python3.11    # Debian's build: no RPATH, no libpython.so dependency
VER=3.11
[[ -f $AGENT_SRC/__main__.py ]] || die "agent not found: $AGENT_SRC/__main__.py (set AGENT_SRC=...)"
[[ -x $PY ]] || die "$PY missing (run scripts/setup_system.sh)"
# Serialise concurrent builds (parallel test workers); one lock per OUT_DIR.
exec 9>"${TMPDIR:-/tmp}/orchard-agent-bundle.$(echo "$OUT" | md5sum | cut -c1-12).lock"
flock 9

# Stdlib parts the agent never needs (GUI, tests, build tooling, docs) and
# extension modules needing libraries we do not want to ship (curses,
# readline, gdbm, NIS, libcrypt) or that exist only for CPython's tests.
EXCLUDES=(
  test idlelib tkinter turtledemo turtle.py ensurepip lib2to3 distutils pydoc_data
  'config-*' site-packages dist-packages __pycache__ sitecustomize.py
  'lib-dynload/_test*' 'lib-dynload/_ctypes_test*' 'lib-dynload/_xxtestfuzz*'
  'lib-dynload/xxlimited*' 'lib-dynload/_xxsubinterpreters*'
  'lib-dynload/_curses*' 'lib-dynload/readline*' 'lib-dynload/_dbm*' 'lib-dynload/_gdbm*'
  'lib-dynload/nis*' 'lib-dynload/ossaudiodev*' 'lib-dynload/_crypt*' 'lib-dynload/audioop*'
)

stamp() {
  cat "${BASH_SOURCE[0]}" "$PY" | sha256sum   # contents only: every checkout shares the cache
  dpkg-query -W -f '${Package}=${Version}\n' libc6 libpython$VER-stdlib libssl3 libffi8 ca-certificates 2>/dev/null || true
}

build_runtime() {
  rm -rf "${OUT:?}"/{bin,lib,ssl,.runtime-stamp}
  mkdir -p "$OUT/bin" "$OUT/lib"
  install -m 0755 "$PY" "$OUT/bin/python3"

  # Stdlib at OUT/lib/python3.11: python finds it from its own location
  # (landmark lib/python3.11/os.py next to ../bin), so no PYTHONHOME is needed.
  local ex=() e
  for e in "${EXCLUDES[@]}"; do ex+=("--exclude=python$VER/$e"); done
  ex+=(--exclude=__pycache__)
  tar -C /usr/lib "${ex[@]}" -cf - "python$VER" | tar -C "$OUT/lib" -xf -
  # Dangling symlinks (e.g. into /etc) would break in a container.
  find "$OUT/lib/python$VER" -xtype l -delete

  # Precompile: the mount is read-only, so without .pyc every import would
  # recompile. unchecked-hash pycs are used as-is, whatever the file mtimes.
  "$PY" -I -m compileall -q -j 0 --invalidation-mode unchecked-hash "$OUT/lib/python$VER" >/dev/null

  # Shared libraries of the interpreter and of every kept extension module.
  local f line name path
  for f in "$OUT/bin/python3" "$OUT/lib/python$VER/lib-dynload/"*.so; do
    while read -r line; do
      case $line in
        *"=> not found"*) die "$(basename "$f"): missing library: $line" ;;
        *"=> /"*) name=${line%% =>*}; path=${line#*=> }; path=${path%% (*} ;;
        *) continue ;;
      esac
      [[ -e $OUT/lib/$name ]] || cp -L "$path" "$OUT/lib/$name"
    done < <(ldd "$f")
  done
  # The dynamic loader itself (PT_INTERP of the interpreter).
  cp -L /lib64/ld-linux-x86-64.so.2 "$OUT/lib/ld-linux-x86-64.so.2"

  # CA bundle for outgoing TLS (container images may have none): export
  # SSL_CERT_FILE=/opt/orchard-agent/ssl/cert.pem to use it.
  if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
    mkdir -p "$OUT/ssl" && cp -L /etc/ssl/certs/ca-certificates.crt "$OUT/ssl/cert.pem"
  fi

  # Convenience launcher for images that have /bin/sh (the backend should use
  # the explicit argv from docs/agent_bundle.md, which needs no shell).
  cat >"$OUT/bin/orchard-agent" <<'SH'
#!/bin/sh
# bundle root = parent of this file's directory (symlinks to it resolved)
p=$(readlink -f "$0" 2>/dev/null) || p=$0
d=$(cd "${p%/*}/.." && pwd) || exit 127
exec "$d/lib/ld-linux-x86-64.so.2" --library-path "$d/lib" "$d/bin/python3" -I -S -B "$d/agent" "$@"
SH
  chmod 0755 "$OUT/bin/orchard-agent"
  chmod -R a+rX "$OUT"
}

t0=$SECONDS
if [[ -f $OUT/.runtime-stamp ]] && [[ "$(stamp)" == "$(<"$OUT/.runtime-stamp")" ]]; then
  log "runtime in $OUT up to date"
else
  log "building runtime in $OUT"
  build_runtime
  stamp >"$OUT/.runtime-stamp"
  log "runtime built in $((SECONDS - t0)) s"
fi

# Always refresh the agent (cheap): its *.py files, each re-copied only when changed (stable
# mtimes), stale ones removed, then byte-compiled (checked-hash: a pyc is used only while its
# source matches, so the read-only mount never recompiles and never runs stale code).
rm -f "$OUT/agent.py"  # the one-file agent of earlier bundles
mkdir -p "$OUT/agent"
for f in "$OUT/agent"/*.py; do [[ -e $f && ! -e $AGENT_SRC/${f##*/} ]] && rm -f "$f"; done
for f in "$AGENT_SRC"/*.py; do cmp -s "$f" "$OUT/agent/${f##*/}" || install -m 0644 "$f" "$OUT/agent/${f##*/}"; done
"$PY" -I -m compileall -q --invalidation-mode checked-hash "$OUT/agent" >/dev/null
chmod -R a+rX "$OUT/agent"

# Smoke test on the host, through the same loader path the containers use.
"$OUT/lib/ld-linux-x86-64.so.2" --library-path "$OUT/lib" "$OUT/bin/python3" -I -S -B -c \
  'import json, ssl, ctypes, selectors, base64, subprocess, http.server, socketserver, hashlib, zlib' \
  || die "smoke test failed"
log "ok: $OUT ($(du -sh "$OUT" | cut -f1))"
