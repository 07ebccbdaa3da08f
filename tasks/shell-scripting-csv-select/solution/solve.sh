#!/bin/bash
set -euo pipefail
cat > /app/csvselect.sh <<'SH'
#!/bin/bash
# Prints the header and the rows of a simple CSV whose COLUMN equals VALUE.
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 COLUMN VALUE [FILE]" >&2
  exit 2
fi
column=$1
value=$2
file=${3:--}
if [ "$file" != - ] && [ ! -f "$file" ]; then
  echo "no such file: $file" >&2
  exit 1
fi
out=$(awk -F, -v col="$column" -v val="$value" '
  NR == 1 {
    for (i = 1; i <= NF; i++) if ($i == col) idx = i
    if (!idx) exit 3
    print; next
  }
  $idx == val' "$file")
status=$?
if [ "$status" -eq 3 ]; then
  echo "no such column: $column" >&2
  exit 1
fi
printf '%s\n' "$out"
SH
chmod +x /app/csvselect.sh
