#!/bin/bash
set -euo pipefail
cd /app
export LC_ALL=C
awk -F, '
  FNR == 1 { next }
  FILENAME == "products.csv" { name[$1] = $2; cat[$1] = $3; stock[$1] = $4; level[$1] = $5; next }
  ($2 in stock) { stock[$2] += $3; next }
  { print $2 > "unknown.tmp" }
  END {
    for (s in stock) print s "," name[s] "," cat[s] "," stock[s] "," (stock[s] <= level[s] ? "yes" : "no") > "rows.tmp"
  }' products.csv stock_moves.csv
{ echo "sku,name,category,closing,reorder"; sort rows.tmp; } > stock_report.csv
{ echo "category,closing"; awk -F, '{ t[$3] += $4 } END { for (c in t) print c "," t[c] }' rows.tmp | sort; } \
  > category_totals.csv
sort -u unknown.tmp > unknown_skus.txt
rm -f rows.tmp unknown.tmp
