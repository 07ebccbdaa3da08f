#!/bin/bash
# Partly correct (for reward tests): switches debug off and drops comments, nothing else; passes 2 of 6.
set -euo pipefail
cd /app
sed -i -e 's/^debug = true$/debug = false/' -e '/^[[:space:]]*#/d' app.conf
