#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/hi.txt 2>/dev/null)" = hi ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
