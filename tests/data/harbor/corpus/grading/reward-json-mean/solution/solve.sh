#!/bin/bash
set -e
echo 7 > /app/a.txt; echo 9 > /app/b.txt
