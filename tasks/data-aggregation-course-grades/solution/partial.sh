#!/bin/bash
# Partly correct (for reward tests): treats a null score as 0 and writes no top-students file.
set -euo pipefail
python3 - <<'PY'
import json
from collections import defaultdict
by = defaultdict(list)
for rec in json.load(open("/app/grades.json")):
  by[rec["course"]].append(rec["score"] or 0)
with open("/app/course_summary.csv", "w") as f:
  f.write("course,students,mean,min,max,pass_rate\n")
  for c, s in sorted(by.items()):
    f.write(f"{c},{len(s)},{sum(s) / len(s):.2f},{min(s)},{max(s)},{sum(x >= 50 for x in s) / len(s):.2f}\n")
PY
