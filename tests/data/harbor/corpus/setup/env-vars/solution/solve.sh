#!/bin/bash
set -e
echo "$GREETING" > "$TARGET_FILE"
