#!/bin/bash
set -euo pipefail
cat > /app/render.sh <<'SH'
#!/usr/bin/env python3
"""Renders {{NAME}} placeholders of a template from the environment."""
import os
import re
import sys

PLACEHOLDER = re.compile(r"\{\{([A-Z_][A-Z0-9_]*)\}\}")

if len(sys.argv) != 2 or not os.path.isfile(sys.argv[1]) or not os.access(sys.argv[1], os.R_OK):
  print("usage: render.sh TEMPLATE", file=sys.stderr)
  sys.exit(2)
with open(sys.argv[1], newline="") as f:
  text = f.read()
missing = [n for n in dict.fromkeys(PLACEHOLDER.findall(text)) if n not in os.environ]
if missing:
  for name in missing:
    print(f"missing: {name}", file=sys.stderr)
  sys.exit(1)
sys.stdout.write(PLACEHOLDER.sub(lambda m: os.environ[m.group(1)], text))
SH
chmod +x /app/render.sh
