#!/bin/bash
set -euo pipefail
cd /app/data
find . -type f -size +10240c -printf '%P\n' | LC_ALL=C sort > /app/large_files.txt
find . -type f -empty -delete
