#!/bin/bash
mkdir -p /logs/verifier
if [ "$(bash /app/src/add.sh 2 3)" = 5 ] && [ "$(bash /app/src/add.sh 10 -4)" = 6 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
