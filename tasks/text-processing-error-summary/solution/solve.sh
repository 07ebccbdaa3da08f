#!/bin/bash
set -euo pipefail
cd /app
awk '$2 == "ERROR" { gsub(/[][]/, "", $3); print $3 }' logs/app.log \
  | sort | uniq -c | awk '{ print $1, $2 }' | sort -k1,1nr -k2,2 > error_summary.txt
awk '$2 == "ERROR" { print substr($1, 12, 2) }' logs/app.log \
  | sort | uniq -c | awk '{ print $2, $1 }' > error_hours.txt
