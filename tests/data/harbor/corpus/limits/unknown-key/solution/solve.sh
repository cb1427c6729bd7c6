#!/bin/bash
set -e
echo yes > /app/ok.txt
