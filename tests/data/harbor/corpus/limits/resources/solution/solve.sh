#!/bin/bash
set -e
nproc > /app/cpus.txt
