#!/bin/bash
set -e
tr a-z A-Z < /app/version.txt > /app/answer.txt
