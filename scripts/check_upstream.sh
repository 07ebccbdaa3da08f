#!/usr/bin/env bash
# Run the reference solutions of a folder of upstream task folders (Terminal-Bench 1 / Harbor, unchanged) and
# print the table: task, loaded, verified, refused / infrastructure kind, seconds (scripts/check_upstream.py).
#   bash scripts/check_upstream.sh DATASET_DIR [N] [key=value ...]
# N: that many task folders, evenly spread over the sorted names (default: all). Builds get the host's network
# (env.build_network: host) for what the images and verifier scripts fetch; episodes have none.
set -euo pipefail
if [ $# -lt 1 ]; then echo "usage: bash scripts/check_upstream.sh DATASET_DIR [N] [key=value ...]" >&2; exit 2; fi
dir=$(cd "$1" && pwd); shift
n=()
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then n=(--n "$1"); shift; fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=$(bash scripts/setup.sh | tail -n 1)
bash scripts/docker_up.sh
bash scripts/build_base_image.sh all  # the whole family upstream images map onto
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec "$py" scripts/check_upstream.py "$dir" "${n[@]}" "$@"
