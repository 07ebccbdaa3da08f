#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
from pathlib import Path
p = Path("/app/wordfreq.py")
s = p.read_text()
s = s.replace("import sys\n", "import re\nimport sys\n", 1)
s = s.replace('  return text.split(" ")', '  return re.findall(r"[a-z]+(?:\'[a-z]+)*", text.lower())')
s = s.replace("key=lambda kv: kv[1], reverse=True)", "key=lambda kv: (-kv[1], kv[0]))")
s = s.replace("ranked[:n - 1]", "ranked[:n]")
s = s.replace("n = argv[2] if len(argv) > 2 else 3", "n = int(argv[2]) if len(argv) > 2 else 3")
s = s.replace('print(f"{word}: {count}")', 'print(f"{word} {count}")')
p.write_text(s)
PY
