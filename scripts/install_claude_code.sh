#!/usr/bin/env bash
# Claude Code (@anthropic-ai/claude-code, pinned in wrappers/harnesses/claude_code.py) into
# the harness cache (~/.cache/orchard-gym/harness/npm/..., what local sandboxes see read-only).
# Idempotent: a finished install is kept; needs npm (Debian's nodejs/npm) and .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python - <<'PY'
from orchard_gym.wrappers.harnesses.claude_code import CLAUDE_CODE
print(f"[install] {' '.join(CLAUDE_CODE.npm)} in {CLAUDE_CODE.install()}")
PY
