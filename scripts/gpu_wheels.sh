#!/usr/bin/env bash
# Download into .whl/ the wheels that scripts/gpu_check.sh installs on a GPU machine whose image has JAX,
# CUDA, flax/optax/orbax and friends but not maxtext and the modules maxtext imports (found by importing the
# actor under that image's JAX 0.11 with these wheels and nothing else). Versions are requirements.lock's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=$(bash scripts/setup.sh | tail -n 1)
pkgs=(maxtext flax aqtp qwix pathwaysutils omegaconf antlr4-python3-runtime tokamax drjax grain portpicker
      array-record fastapi starlette pydantic pydantic-core annotated-types typing-inspection opentelemetry-api uvicorn immutabledict fire termcolor einshape)
pins=()
for p in "${pkgs[@]}"; do
  v=$(grep -iE "^${p//-/[-_.]}==" requirements.lock | head -n 1 || true)
  [ -n "$v" ] || v=$("$py" -m pip show "$p" 2>/dev/null | awk -v p="$p" '/^Version:/{print p"=="$2}' || true)
  pins+=("${v:-$p}")
done
mkdir -p .whl
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl "${pins[@]}"
du -sh .whl
