#!/bin/bash
set -e
cat /app/parts/a.txt /app/parts/b.txt > /app/joined.txt
