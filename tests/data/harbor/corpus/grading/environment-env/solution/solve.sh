#!/bin/bash
set -e
echo "$MODE" > /app/mode.txt
