#!/bin/bash
set -e
echo hi > /app/hi.txt
