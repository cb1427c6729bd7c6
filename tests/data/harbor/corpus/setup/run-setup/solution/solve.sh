#!/bin/bash
set -e
sed -i 's/- \$2/+ $2/' /app/src/add.sh
