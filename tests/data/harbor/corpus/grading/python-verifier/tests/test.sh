#!/bin/bash
mkdir -p /logs/verifier
python3 - <<'PY'
import json
try:
    ok = json.load(open("/app/result.json")) == {"total": 42}
except (OSError, ValueError):
    ok = False
open("/logs/verifier/reward.txt", "w").write("1" if ok else "0")
PY
