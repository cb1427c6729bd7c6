#!/bin/bash
mkdir -p /logs/verifier
if [ "$TARGET_FILE" = /app/greeting.txt ] && [ "$(cat /app/greeting.txt 2>/dev/null)" = "$GREETING" ] && [ "$GREETING" = hello-harbor ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
