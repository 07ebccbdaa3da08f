#!/bin/bash
# Partly correct (for reward tests): the list is right but empty files are kept; passes 2 of 3 checks.
set -euo pipefail
cd /app/data
find . -type f -size +10240c -printf '%P\n' | LC_ALL=C sort > /app/large_files.txt
