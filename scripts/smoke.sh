#!/usr/bin/env bash
# Command 1: set everything up on a fresh machine and run the CPU smoke training end to end
# (configs/smoke.yml: tiny MaxText Qwen3 actor + critic, real Docker tasks). Extra arguments are
# key=value config overrides passed to `python -m rsi_jax.train`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=$(bash scripts/setup.sh | tail -n 1)
bash scripts/docker_up.sh
bash scripts/build_base_image.sh bookworm trixie  # trixie: the family image of the upstream-format tasks (Python 3.13)
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# Four virtual CPU devices, so the smoke run shards the actor and critic over a real 2 x 2 (fsdp x tensor) mesh.
export XLA_FLAGS="${XLA_FLAGS:---xla_force_host_platform_device_count=4}"
exec "$py" -m rsi_jax.train --config=configs/smoke.yml "$@"
