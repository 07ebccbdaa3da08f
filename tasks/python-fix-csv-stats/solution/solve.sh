#!/bin/bash
set -euo pipefail
python3 - <<'PY'
from pathlib import Path
p = Path("/app/stats.py")
s = p.read_text()
s = s.replace("idx = header.index(column) + 1", "idx = header.index(column)")
s = s.replace("""    cell = row[idx]
    try:
      values.append(int(cell))
    except ValueError:
      pass""", """    if idx >= len(row):
      continue
    try:
      values.append(float(row[idx]))
    except ValueError:
      pass""")
s = s.replace("return sum(values) // len(values)", "return sum(values) / len(values)")
s = s.replace("""  values.sort()
  return values[len(values) // 2]""", """  ordered = sorted(values)
  mid = len(ordered) // 2
  if len(ordered) % 2:
    return ordered[mid]
  return (ordered[mid - 1] + ordered[mid]) / 2""")
s = s.replace("""  print(summary_line(parse_column(rows, column)))""", """  if not rows or column not in rows[0]:
    print(f"unknown column: {column}", file=sys.stderr)
    sys.exit(2)
  print(summary_line(parse_column(rows, column)))""")
p.write_text(s)
PY
