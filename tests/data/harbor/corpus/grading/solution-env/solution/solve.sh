#!/bin/bash
set -e
[ -n "$ANSWER" ]; echo "$ANSWER" > /app/answer.txt
