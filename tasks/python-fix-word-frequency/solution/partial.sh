#!/bin/bash
# Partly correct (for reward tests): fixes the tokenizer only; passes 5 of 10 checks.
set -euo pipefail
python3 - <<'PY'
from pathlib import Path
p = Path("/app/wordfreq.py")
s = p.read_text()
s = s.replace("import sys\n", "import re\nimport sys\n", 1)
s = s.replace('  return text.split(" ")', '  return re.findall(r"[a-z]+(?:\'[a-z]+)*", text.lower())')
p.write_text(s)
PY
