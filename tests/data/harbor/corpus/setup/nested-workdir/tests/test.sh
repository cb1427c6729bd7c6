#!/bin/bash
mkdir -p /logs/verifier
if [ "$(tr -d "[:space:]" < /app/project/lines.txt 2>/dev/null)" = 3 ] && [ -f /app/project/logs/setup.txt ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
