#!/usr/bin/env bash
# Make a headless Chromium and its chromedriver available for the run browser's tests (tests/view): Debian's
# chromium and chromium-driver packages, installed when missing (as root; elsewhere it only says what is missing).
# Idempotent; never fails the caller: without a browser those tests are skipped, saying why.
set -uo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  echo "[browser] $(chromium --version 2>/dev/null | head -n 1) and chromedriver present" >&2
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "[browser] chromium / chromedriver missing and cannot be installed here (needs root and apt-get): the browser tests will be skipped" >&2
  exit 0
fi
echo "[browser] installing chromium and chromium-driver from Debian ..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends chromium chromium-driver >&2 \
  || echo "[browser] install failed: the browser tests will be skipped" >&2
exit 0
