#!/bin/bash
mkdir -p /logs/verifier
if [ -s /app/nics.txt ] && [ "$(awk 'NR > 2 {sub(":", "", $1); if ($1 != "lo") n++} END {print n + 0}' /proc/net/dev)" = 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
