#!/bin/bash

cd /app/src
find . -type f | LC_ALL=C sort | while read -r f; do
  awk -v path="${f#./}" '{
    i = index($0, "TODO:")
    if (i) { text = substr($0, i + 5); gsub(/^[ \t]+|[ \t]+$/, "", text); print path ":" FNR ":" text }
  }' "$f"
done | LC_ALL=C sort -t: -k1,1 -k2,2n > /app/todos.txt
