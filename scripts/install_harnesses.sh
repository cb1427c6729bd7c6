#!/usr/bin/env bash
# The harnesses' packages (pinned, from PyPI and npm), installed once into the orchard
# cache ($ORCHARD_CACHE, default ~/.cache/orchard-gym/harness/), which local sandboxes see
# read-only, and the archives shipped into docker/kubernetes sandboxes (an npm harness's
# `sandbox_payload`, a pip harness's whole venv). Idempotent: an install or archive already
# there is kept (each is keyed by what it holds). The harnesses install at once, each said in a
# line when its (possibly minutes-long) work starts and one when it ends; --paths also prints
# where each part lies.
# A harness with `python="X.Y"` (OpenHands: 3.13) gets its venv built on Debian's own pythonX.Y,
# bundled in the venv, from a cached `debootstrap --variant=minbase` (root; wrappers/harness/python.py).
#   bash scripts/install_harnesses.sh [--paths] [NAME ...]     # default: every built-in harness
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python - "$@" <<'PY'
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from orchard_gym.envs.swe.venvs import cache_root
from orchard_gym.wrappers.harness import all_harnesses
from orchard_gym.wrappers.harness.install import ensure_payload, ensure_venv_payload

args = sys.argv[1:]
paths = "--paths" in args
known = all_harnesses()
names = [a for a in args if a != "--paths"] or sorted(known)
unknown = [n for n in names if n not in known]
if unknown:
    sys.exit(f"install_harnesses: unknown harness {', '.join(unknown)} (known: {', '.join(sorted(known))})")
print(f"[harnesses] {len(names)} into {cache_root() / 'harness'} (pinned packages; minutes the first time, "
      "seconds once there)", flush=True)


def install(name: str) -> str | None:
    """Install one harness; None when ready, else why not (in one line)."""
    h = known[name]
    pins = ", ".join([*(f"pip {r}" for r in h.requirements), *(f"npm {p}" for p in h.npm)]) or "nothing to install"
    print(f"[harnesses] {name}: {pins} ...", flush=True)
    started = time.monotonic()
    try:
        venv, npm = h.install(), h.install_npm()
        shipped = ensure_venv_payload(venv) if venv else None
        payload = ensure_payload(npm, h.sandbox_payload) if npm and h.sandbox_payload else None
    except Exception as e:  # npm missing, no network, a failed build: said in one line, the others go on
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"[harnesses] {name}: FAILED: {why}", flush=True)
        return why
    lines = [f"[harnesses] {name}: ready ({time.monotonic() - started:.0f}s)"]
    if paths:
        lines += [f"    {what}: {where}" for what, where in (("venv", venv), ("npm", npm), ("venv archive", shipped),
                                                            ("payload", payload)) if where]
    print("\n".join(lines), flush=True)
    return None


# at once: one after another they took 220 s on a brand-new machine, each waiting on its downloads
# before its CPU work; installs that share a build (the Debian python of OpenHands and Harbor) wait on its lock
with ThreadPoolExecutor(max_workers=len(names)) as pool:
    failed = [n for n, why in zip(names, pool.map(install, names)) if why is not None]
if failed:
    sys.exit(f"[harnesses] not installed: {', '.join(failed)}")
print("[harnesses] done: gym.make(ENV, harness=NAME), orchard eval --harness NAME (docs/harnesses.md)")
PY
