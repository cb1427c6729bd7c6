#!/bin/bash
set -e
touch /app/x /app/y /app/z
