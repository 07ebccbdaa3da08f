#!/bin/bash
# Partly correct (for reward tests): counts right, revenue breakdowns missing; passes some checks only.
set -euo pipefail
python3 - <<'PY'
import csv, json
rows = list(csv.DictReader(open("/app/sales.csv", newline="")))
json.dump({"orders": len(rows), "total_units": sum(int(r["units"]) for r in rows),
           "total_revenue": round(sum(int(r["units"]) * float(r["unit_price"]) for r in rows), 2)},
          open("/app/report.json", "w"))
PY
