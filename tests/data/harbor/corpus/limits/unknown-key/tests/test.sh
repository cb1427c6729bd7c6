#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/ok.txt 2>/dev/null)" = yes ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
