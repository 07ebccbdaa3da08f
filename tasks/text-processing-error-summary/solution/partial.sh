#!/bin/bash
# Partly correct (for reward tests): the component summary only, no hourly report; passes 4 of 6 checks.
set -euo pipefail
cd /app
awk '$2 == "ERROR" { gsub(/[][]/, "", $3); print $3 }' logs/app.log \
  | sort | uniq -c | awk '{ print $1, $2 }' | sort -k1,1nr -k2,2 > error_summary.txt
