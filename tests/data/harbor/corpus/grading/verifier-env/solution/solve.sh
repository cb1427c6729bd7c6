#!/bin/bash
set -e
printf 'orchard\norchard\norchard\n' > /app/word.txt
