#!/bin/bash
# Partly correct (for reward tests): archives everything, caches and .tmp files included; passes 2 of 3.
set -euo pipefail
cd /app
tar -czf backup.tar.gz project
