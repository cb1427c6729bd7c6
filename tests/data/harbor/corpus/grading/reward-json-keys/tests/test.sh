#!/bin/bash
mkdir -p /logs/verifier
n=0; for f in x y z; do [ -f /app/$f ] && n=$((n + 1)); done
r=0; [ $n = 3 ] && r=1
echo "{\"reward\": $r, \"tests_passed\": $n, \"tests_total\": 3, \"tests_failed\": $((3 - n))}" > /logs/verifier/reward.json
