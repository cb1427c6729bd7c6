#!/bin/bash
mkdir -p /logs/verifier
if [ -s /app/cpus.txt ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
