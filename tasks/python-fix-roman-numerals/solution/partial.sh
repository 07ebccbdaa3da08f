#!/bin/bash
# Partly correct (for reward tests): fixes to_roman only; passes 4 of 10 checks.
set -euo pipefail
python3 - <<'PY'
from pathlib import Path
p = Path("/app/roman.py")
s = p.read_text()
s = s.replace('NUMERALS = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]',
              'NUMERALS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"),\n'
              '            (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]')
s = s.replace("if n < 0 or n > 3999:", "if n < 1 or n > 3999:")
s = s.replace("while n > value:", "while n >= value:")
p.write_text(s)
PY
