#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import json
from collections import defaultdict

by_course = defaultdict(list)
for rec in json.load(open("/app/grades.json")):
  if rec["score"] is not None:
    by_course[rec["course"]].append((rec["score"], rec["student"]))
with open("/app/course_summary.csv", "w") as f:
  f.write("course,students,mean,min,max,pass_rate\n")
  for course, recs in sorted(by_course.items()):
    scores = [s for s, _ in recs]
    passed = sum(s >= 50 for s in scores) / len(scores)
    f.write(f"{course},{len(scores)},{sum(scores) / len(scores):.2f},{min(scores)},{max(scores)},{passed:.2f}\n")
with open("/app/top_students.txt", "w") as f:
  for course, recs in sorted(by_course.items()):
    best = min(recs, key=lambda r: (-r[0], r[1]))
    f.write(f"{course} {best[1]}\n")
PY
