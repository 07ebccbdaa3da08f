#!/bin/bash
# Partly correct (for reward tests): keeps the extension's case, so upper-case extensions land in the wrong
# folders; passes 1 of 3 checks.
set -euo pipefail
cd /app
for f in inbox/*; do
  name=$(basename "$f")
  case "$name" in *.*) ext=${name##*.} ;; *) ext=noext ;; esac
  mkdir -p "sorted/$ext"
  mv "$f" "sorted/$ext/$name"
done
