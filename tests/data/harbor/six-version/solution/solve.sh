#!/bin/bash
set -e
python -c 'import six; print(six.__version__)' > /app/version.txt
