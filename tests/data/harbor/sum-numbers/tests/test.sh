#!/bin/bash
# The verifier: 1 when /app/answer.txt holds the sum of /app/data.txt, else 0.
mkdir -p /logs/verifier
expected=$(awk '{s += $1} END {print s}' /app/data.txt)
if [ "$(tr -d '[:space:]' < /app/answer.txt 2>/dev/null)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
