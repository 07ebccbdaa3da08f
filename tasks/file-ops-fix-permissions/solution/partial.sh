#!/bin/bash
# Partly correct (for reward tests): directories 755 and files 644 only; passes 1 of 3 checks.
set -euo pipefail
cd /app/site
find . -type d -exec chmod 755 {} +
find . -type f -exec chmod 644 {} +
