#!/bin/bash
set -e
wc -l < /app/project/notes.txt > /app/project/lines.txt
