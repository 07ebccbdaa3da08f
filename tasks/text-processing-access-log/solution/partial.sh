#!/bin/bash
# Partly correct (for reward tests): only the status report; passes 2 of 6 checks.
set -euo pipefail
cd /app
export LC_ALL=C
awk -F'"' '{ split($3, a, " "); print a[1] }' logs/access.log | sort | uniq -c \
  | awk '{ print $2, $1 }' | sort -k1,1n > status_counts.txt
