#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/quick.txt 2>/dev/null)" = fast ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
