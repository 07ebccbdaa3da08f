#!/bin/bash
# Partly correct (for reward tests): sorts and copies the input but still misses touching and nested
# intervals; passes some checks but not all.
set -euo pipefail
python3 - <<'PY'
from pathlib import Path
p = Path("/app/intervals.py")
s = p.read_text()
s = s.replace("  for iv in intervals:\n", "  for iv in sorted(intervals):\n")
s = s.replace("      merged.append(iv)", "      merged.append(list(iv))")
s = s.replace("  return merged\n", "  return [tuple(iv) for iv in merged]\n", 1)
p.write_text(s)
PY
