#!/bin/bash
# Partly correct (for reward tests): ignores the `active` column; passes 2 of 6 checks.
set -euo pipefail
cd /app
awk -F, 'NR > 1 { d = tolower($4); gsub(/^ +| +$/, "", d); e = tolower($3); gsub(/^ +| +$/, "", e)
  if (d == "engineering") print e }' contacts.csv | LC_ALL=C sort -u > engineering_emails.txt
awk -F, 'NR > 1 { d = tolower($4); gsub(/^ +| +$/, "", d); n[d]++ } END { for (d in n) print d "," n[d] }' \
  contacts.csv | LC_ALL=C sort > department_counts.txt
