#!/bin/bash
mkdir -p /logs/verifier
if [ -f /app/sorted.txt ] && [ "$(cat /app/sorted.txt)" = "$(printf "apple\nkiwi\npear\n")" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
