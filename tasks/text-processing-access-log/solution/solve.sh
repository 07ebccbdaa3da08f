#!/bin/bash
set -euo pipefail
cd /app
export LC_ALL=C
# The status code is the first field after the quoted request, wherever the request ends.
awk -F'"' '{ split($3, a, " "); print a[1] }' logs/access.log | sort | uniq -c \
  | awk '{ print $2, $1 }' | sort -k1,1n > status_counts.txt
awk '{ print $1 }' logs/access.log | sort | uniq -c | awk '{ print $1, $2 }' \
  | sort -k1,1nr -k2,2 | head -n 5 > top_ips.txt
awk -F'"' '{ split($3, a, " "); if (a[1] == "404") { split($2, r, " "); sub(/\?.*/, "", r[2]); print r[2] } }' \
  logs/access.log | sort -u > not_found.txt
