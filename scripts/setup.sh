#!/usr/bin/env bash
# Create .venv with a Python >= 3.12 and install exactly requirements.lock plus this package (editable), and
# requirements-tpu.lock into .venv/libtpu (kept off the import path: see rsi_jax/pipeline/compile_plan.py).
# Idempotent: skips the install when the lock and pyproject have not changed since the last one.
# Usage: source-free; prints the venv's python path on its last line.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

find_python() {
  local c
  for c in "${RSI_PYTHON:-}" python3.12 python3.13 python3 \
           "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python \
           "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python \
           /usr/bin/python3.12 /usr/local/bin/python3.12; do
    [ -n "$c" ] || continue
    command -v "$c" >/dev/null 2>&1 || [ -x "$c" ] || continue
    if "$c" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      command -v "$c" 2>/dev/null || echo "$c"; return 0
    fi
  done
  return 1
}

venv="$root/.venv"
stamp="$venv/.rsi_jax-install-stamp"
want=$(cat requirements.lock requirements-tpu.lock pyproject.toml | sha256sum | cut -c1-16)
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "[setup] .venv is up to date ($want)" >&2
  echo "$venv/bin/python"; exit 0
fi

py=$(find_python) || { echo "[setup] ERROR: no Python >= 3.12 found (maxtext needs it); set RSI_PYTHON=/path/to/python3.12" >&2; exit 1; }
echo "[setup] using $py ($("$py" --version 2>&1))" >&2
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip >&2
echo "[setup] installing requirements.lock (pinned) ..." >&2
"$venv/bin/python" -m pip install -q -r requirements.lock >&2
# setuptools warns on every editable install that a folder named like the package may shadow it (a box of text,
# not a fault: the repository root is that folder by design); that one message is silenced, nothing else
PYTHONWARNINGS="ignore:Editable installation" "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation \
  -e . >&2
echo "[setup] installing requirements-tpu.lock into .venv/libtpu (the compile plan's TPU compiler) ..." >&2
rm -rf "$venv/libtpu"
"$venv/bin/python" -m pip install -q --no-deps --target "$venv/libtpu" -r requirements-tpu.lock >&2
echo "$want" > "$stamp"
echo "[setup] done" >&2
echo "$venv/bin/python"
