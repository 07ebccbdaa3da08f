#!/usr/bin/env bash
# Remove task images of earlier runs: every rsi-task-* image but the newest of each task (--all: every one)
# that no container uses. Base images (rsi-base) are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
keep=True
[[ "${1:-}" == "--all" ]] && keep=False
.venv/bin/python - "$keep" <<'PY'
import sys
from rsi_jax.env.images import prune_task_images
from rsi_jax.env.sandbox import docker_client
removed = prune_task_images(docker_client(), keep_latest=sys.argv[1] == "True")
print(f"removed {len(removed)} task image(s)" + "".join(f"\n  {t}" for t in removed))
PY
