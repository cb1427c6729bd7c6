#!/bin/bash
mkdir -p /logs/verifier
a=0; b=0
[ "$(cat /app/a.txt 2>/dev/null)" = 7 ] && a=1
[ "$(cat /app/b.txt 2>/dev/null)" = 9 ] && b=1
echo "{\"first\": $a, \"second\": $b}" > /logs/verifier/reward.json
