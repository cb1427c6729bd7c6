#!/bin/bash
mkdir -p /logs/verifier
if [ -n "$EXPECTED" ] && [ "$(grep -c -x "$EXPECTED" /app/word.txt 2>/dev/null)" = "$EXPECTED_COUNT" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
