#!/bin/bash
set -e
awk '{s += $1} END {print s}' /app/data.txt > /app/answer.txt
