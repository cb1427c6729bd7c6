#!/bin/bash
set -e
tail -n +2 /app/table.csv | wc -l > /app/count.txt
