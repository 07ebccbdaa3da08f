#!/usr/bin/env bash
# Command 2: set everything up on a fresh machine and run the whole test suite.
#   - .venv from requirements.lock (scripts/setup.sh)
#   - a Docker daemon (scripts/docker_up.sh) and the base images rsi-base, rsi-base-trixie (scripts/build_base_image.sh)
#   - Chromium and chromedriver from Debian for the run browser's tests (scripts/browser_up.sh)
#   - pytest over tests/ (Docker tests are required to run: RSI_REQUIRE_DOCKER=1)
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/rl -x`).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=$(bash scripts/setup.sh | tail -n 1)
bash scripts/docker_up.sh
bash scripts/build_base_image.sh bookworm trixie  # trixie: the family image of the upstream-format tasks (Python 3.13)
bash scripts/browser_up.sh  # headless Chromium + chromedriver for the run browser's tests (tests/view)
export RSI_REQUIRE_DOCKER=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
set +e
"$py" -m pytest -q --durations=20 "${@:-tests}"
rc=$?
set -e
# pytest exits 5 when it collected no tests; that is a broken suite here, not a pass.
if [ "$rc" -eq 5 ]; then echo "[test] no tests were collected" >&2; exit 1; fi
exit "$rc"
