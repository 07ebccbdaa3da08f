#!/bin/bash
# Partly correct (for reward tests): a grep on the value anywhere in the line, no error handling.
set -euo pipefail
cat > /app/csvselect.sh <<'SH'
#!/bin/bash
head -n 1 "${3:-/dev/stdin}"
grep -- ",$2," "${3:-/dev/stdin}" || true
SH
chmod +x /app/csvselect.sh
