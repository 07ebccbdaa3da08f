#!/bin/bash

cat > /app/rotate.sh <<'SH'
#!/bin/bash
# Rotates LOGFILE keeping at most KEEP old copies: LOGFILE.1 is the newest.
usage() { echo "usage: $0 LOGFILE KEEP" >&2; exit 2; }
[ $# -eq 2 ] || usage
log=$1
keep=$2
[[ "$keep" =~ ^[0-9]+$ ]] && [ "$keep" -ge 1 ] || usage
[ -s "$log" ] || exit 0
rm -f "$log.$keep"
for ((i = keep - 1; i >= 1; i--)); do
  if [ -e "$log.$i" ]; then
    mv "$log.$i" "$log.$((i + 1))"
  fi
done
mv "$log" "$log.1"
: > "$log"
SH
chmod +x /app/rotate.sh
