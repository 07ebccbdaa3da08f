#!/bin/bash
# Partly correct (for reward tests): fixes mean and median only; passes 4 of 10 checks.
set -euo pipefail
python3 - <<'PY'
from pathlib import Path
p = Path("/app/stats.py")
s = p.read_text()
s = s.replace("return sum(values) // len(values)", "return sum(values) / len(values)")
s = s.replace("""  values.sort()
  return values[len(values) // 2]""", """  ordered = sorted(values)
  mid = len(ordered) // 2
  return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2""")
p.write_text(s)
PY
