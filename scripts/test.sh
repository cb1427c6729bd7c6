#!/usr/bin/env bash
# Everything the test suite needs on a fresh Debian machine, then the suite itself.
# Idempotent (a second run's set-up takes seconds); runs as root with no stdin (this is what
# CI runs, via .ci/run). Tiers (docs/testing.md, tests/tiers.py):
#   bash scripts/test.sh [pytest args...]          # the full suite
#   bash scripts/test.sh --fast [pytest args...]   # the fast tier: unit and local-backend tests
# The tests run in $ORCHARD_TEST_WORKERS pytest-xdist workers (default 3 on the 2-core CI
# machine; see below); `-n 0` runs in-process.
set -euo pipefail
cd "$(dirname "$0")/.."

# Bytecode caches on for the run: many container images set PYTHONDONTWRITEBYTECODE=1, and
# then every Python process the suite starts (workers, CLI runs, examples: hundreds) compiled
# the project's modules again, and pytest rewrote every test module's asserts again in each
# worker (collection: 15 CPU-s a worker without the caches, 11 with them, on this machine).
unset PYTHONDONTWRITEBYTECODE

bash scripts/setup_system.sh          # bubblewrap, podman, redis-server, debootstrap, ...
# .venv without compiling all of it up front (ORCHARD_LAZY_BYTECODE): only this host's processes run it,
# and they import a fraction of its 2.3 GB (torch, transformers, ...). Compiling every module was
# 46 CPU-s, 28 s of a fresh clone's 36 s install, before anything else could start.
ORCHARD_LAZY_BYTECODE=1 bash scripts/install.sh dev,server,docker,k8s,train,gui,integrations   # gui: the miniwob package (MiniWoB++ pages); train: torch (CPU), transformers, TRL for tests/test_train_grpo.py; integrations: OpenEnv, SkyRL-Gym
# The type checker (pyproject.toml [tool.mypy]) runs beside the rest of the set-up: it needs only .venv,
# and it is one CPU for ~15 s with a cold cache. Its cache lives with the user's caches (mypy checks each
# cached module by content hash, so a fresh clone on this machine reuses it: under a second).
mypy_log=$(mktemp)
MYPY_CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/orchard-gym/mypy" .venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
# The rest of the set-up is independent chains, run at once: on a brand-new machine the first three took
# 390 s one after another and under 200 s at once, both CPUs busy throughout (docs/testing.md). Each
# step still skips what is already there; their lines carry their step's [tag].
setup_pids=() setup_names=()
setup_chain() { local name=$1; shift; bash -c "$*" & setup_pids+=($!); setup_names+=("$name"); }
setup_chain images 'bash scripts/build_test_images.sh &&  # localhost/orchard/{bookworm,busybox}, only if missing
  { bash scripts/build_gui_image.sh &      # localhost/orchard/gui (Xvfb, Chromium, ... + MiniWoB pages), only if its inputs changed
    gui=$!                                 # beside the rest: each needs only the bookworm image
    bash scripts/build_injector_image.sh &&  # localhost/orchard/agent-injector, only if the bundle changed
    .venv/bin/python scripts/build_swe_images.py &&   # one image per SWE task, only if its inputs changed
    .venv/bin/python scripts/build_swebench_layout_images.py   # a built-in task in the SWE-bench image layout
    rest=$?; wait $gui && exit $rest; }'
# The images chain is the longest (its steps wait on each other); the other two take the CPU it leaves.
setup_chain harnesses 'nice -n 10 bash scripts/install_harnesses.sh'  # mini-swe-agent, OpenHands (PyPI), Codex CLI, OpenClaw, Claude Code (npm), pinned, only if missing
# What the workers import, compiled once here (collecting the run's tests imports every test module; the
# .pyc files and pytest's rewritten test modules are kept), not by the three workers at once as they
# start. Only a warm-up: its failures show again, and count, in the run itself.
setup_chain bytecode "nice -n 10 .venv/bin/python -m pytest -q -p no:cacheprovider --collect-only -n 0 $(printf '%q ' "$@")>/dev/null 2>&1; true"
setup_chain venvs 'nice -n 10 bash scripts/install_verifiers.sh &&  # .venv-verifiers: verifiers 0.4 (pins mcp 2, OpenEnv needs mcp<2)
  nice -n 10 bash scripts/install_harbor.sh >/dev/null'  # harbor==0.25.0 on Debian's python3.13 (Harbor's own runner and models), only if missing
setup_failed=()
for i in "${!setup_pids[@]}"; do wait "${setup_pids[$i]}" || setup_failed+=("${setup_names[$i]}"); done
if ((${#setup_failed[@]})); then echo "scripts/test.sh: set-up failed: ${setup_failed[*]} (see above)" >&2; exit 1; fi

# The docker backend's tests talk to Podman's Docker API. Stop the service afterwards only
# if we started it (someone else's service on this machine keeps running).
if ! bash scripts/podman_service.sh status >/dev/null 2>&1; then
  trap 'bash scripts/podman_service.sh stop' EXIT
fi
export "$(bash scripts/podman_service.sh start)"   # DOCKER_HOST=unix:///run/podman/podman.sock

export PATH="$PWD/.venv/bin:$PATH"
# Everything above is installed, so a test that needs any of it fails instead of skipping;
# only the variant limits in docs/testing.md may skip. A module that cannot even be
# imported is an error, and the rest of the suite still runs.
export ORCHARD_REQUIRE=all
ruff check .   # the linter (config in pyproject.toml): a finding fails the run before the tests start
mypy_status=0; wait "$mypy_pid" || mypy_status=$?   # the type checker on the ground floor's core types
cat "$mypy_log"; rm -f "$mypy_log"
if ((mypy_status)); then echo "scripts/test.sh: mypy found errors (above)" >&2; exit "$mypy_status"; fi
# --dist loadgroup with the groups of tests/tiers.py: a module's tests stay in one worker, in order,
# sharing its module fixtures; every test that drives Podman runs in one worker, one at a time.
# Three workers by default on two cores: with two, the CPUs sat idle a quarter of the time (tests
# wait on subprocesses, sandboxes and containers), and the Podman group alone fills one. Each
# worker has its own TMPDIR (so its own default sandbox roots, tests/conftest.py), servers count as
# up only when their own process listens on the port (tests/service_helpers.py), and local
# sandboxes' cgroups are named by id and root: what failed beside another worker before.
python -m pytest -q -p no:cacheprovider --continue-on-collection-errors --durations=25 \
  -n "${ORCHARD_TEST_WORKERS:-3}" --dist loadgroup "$@"   # no exec: the trap must run after it
