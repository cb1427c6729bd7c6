#!/bin/bash
mkdir -p /logs/verifier
if [ "$MODE" = strict ] && [ "$(cat /app/mode.txt 2>/dev/null)" = strict ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
