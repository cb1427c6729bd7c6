#!/bin/bash
set -e
sort /app/data/words.txt > /app/sorted.txt
