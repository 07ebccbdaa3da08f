#!/bin/bash
set -euo pipefail
cd /app
tar --exclude='*.tmp' --exclude='__pycache__' -czf backup.tar.gz project
