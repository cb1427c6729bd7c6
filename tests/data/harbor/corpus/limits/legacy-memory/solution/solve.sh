#!/bin/bash
set -e
echo done > /app/status.txt
