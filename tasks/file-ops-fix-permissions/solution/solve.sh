#!/bin/bash
set -euo pipefail
cd /app/site
find . -type d -exec chmod 755 {} +
find . -type f -exec chmod 644 {} +
chmod 755 bin/*.sh
chmod 700 private
find private -type f -exec chmod 600 {} +
