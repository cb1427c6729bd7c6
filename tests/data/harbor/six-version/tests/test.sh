#!/bin/bash
mkdir -p /logs/verifier
python - <<'PY' > /logs/verifier/reward.txt
import pathlib, six
try:
    got = pathlib.Path("/app/version.txt").read_text().strip()
except OSError:
    got = None
print(1 if got == six.__version__ else 0)
PY
