#!/bin/bash
# Partly correct (for reward tests): copies everything that differs but has no dry run, no usage checks and
# does not sort its output.
set -euo pipefail
cat > /app/sync.sh <<'SH'
#!/bin/bash
cd "$1" && find . -type f | while read -r f; do
  cmp -s "$f" "$2/$f" && continue
  mkdir -p "$2/$(dirname "$f")"; cp "$f" "$2/$f"; echo "copied ${f#./}"
done
SH
chmod +x /app/sync.sh
