#!/usr/bin/env bash
# Everything the test suite needs on a fresh Debian machine, then the suite itself.
# Idempotent; runs as root with no stdin (this is what CI runs, via .ci/run).
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup_system.sh          # bubblewrap, podman, redis-server, debootstrap, ...
bash scripts/install.sh dev,server,docker

export PATH="$PWD/.venv/bin:$PATH"
exec python -m pytest -q -p no:cacheprovider "$@"
