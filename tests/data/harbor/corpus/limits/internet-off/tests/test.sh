#!/bin/bash
mkdir -p /logs/verifier
if [ -s /app/nics.txt ] && [ "$(awk '$2 == "00000000" {n++} END {print n + 0}' /proc/net/route)" = 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
