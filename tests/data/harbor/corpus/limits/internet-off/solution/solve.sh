#!/bin/bash
set -e
awk 'NR > 2 {sub(":", "", $1); print $1}' /proc/net/dev > /app/nics.txt
