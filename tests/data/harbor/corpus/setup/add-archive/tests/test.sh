#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/joined.txt 2>/dev/null)" = "$(printf "alpha\nbeta")" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
