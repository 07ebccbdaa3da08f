#!/bin/bash
# Partly correct (for reward tests): retries, but no usage checks, loses quoting and sleeps after the last
# attempt.
set -euo pipefail
cat > /app/retry.sh <<'SH'
#!/bin/bash
n=$1; d=$2; shift 2
for i in $(seq 1 "$n"); do
  echo "attempt $i/$n" >&2
  $@ && exit 0
  s=$?
  sleep "$d"
done
exit $s
SH
chmod +x /app/retry.sh
