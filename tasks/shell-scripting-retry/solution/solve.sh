#!/bin/bash
set -euo pipefail
cat > /app/retry.sh <<'SH'
#!/bin/bash
# Runs a command until it succeeds, at most ATTEMPTS times, DELAY seconds apart.
usage() { echo "usage: $0 ATTEMPTS DELAY COMMAND [ARGS...]" >&2; exit 64; }
[ $# -ge 3 ] || usage
attempts=$1
delay=$2
shift 2
[[ "$attempts" =~ ^[0-9]+$ ]] && [ "$attempts" -ge 1 ] || usage
[[ "$delay" =~ ^([0-9]+([.][0-9]*)?|[.][0-9]+)$ ]] || usage
status=0
for ((i = 1; i <= attempts; i++)); do
  echo "attempt $i/$attempts" >&2
  "$@" && exit 0
  status=$?
  if [ "$i" -lt "$attempts" ]; then sleep "$delay"; fi
done
exit "$status"
SH
chmod +x /app/retry.sh
