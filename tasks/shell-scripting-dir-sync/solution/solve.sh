#!/bin/bash
set -euo pipefail
cat > /app/sync.sh <<'SH'
#!/bin/bash
# Copies files of SRC that are missing or different in DST; never deletes.
usage() { echo "usage: $0 [--dry-run] SRC DST" >&2; exit 2; }
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
[ $# -eq 2 ] || usage
src=$1
dst=$2
[ -d "$src" ] && [ -d "$dst" ] || usage
cd "$src" || exit 2
find . -type f -print0 | LC_ALL=C sort -z | while IFS= read -r -d '' f; do
  rel=${f#./}
  if [ -f "$dst/$rel" ] && cmp -s "$f" "$dst/$rel"; then
    continue
  fi
  if [ "$dry" -eq 0 ]; then
    mkdir -p "$dst/$(dirname "$rel")"
    cp "$f" "$dst/$rel"
  fi
  echo "copied $rel"
done
SH
chmod +x /app/sync.sh
