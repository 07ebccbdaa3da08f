#!/bin/bash
# Partly correct (for reward tests): a sed loop over the environment; breaks on special characters and
# ignores missing variables.
set -euo pipefail
cat > /app/render.sh <<'SH'
#!/bin/bash
text=$(cat "$1")
for name in $(grep -o '{{[A-Z_][A-Z0-9_]*}}' "$1" | tr -d '{}' | sort -u); do
  text=$(printf '%s\n' "$text" | sed "s/{{$name}}/${!name}/g")
done
printf '%s\n' "$text"
SH
chmod +x /app/render.sh
