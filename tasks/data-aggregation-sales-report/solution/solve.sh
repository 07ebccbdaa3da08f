#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import csv
import json
from collections import defaultdict

region, month, units, revenue = defaultdict(float), defaultdict(float), defaultdict(int), defaultdict(float)
orders = total_units = 0
total = 0.0
with open("/app/sales.csv", newline="") as f:
  for row in csv.DictReader(f):
    v = int(row["units"]) * float(row["unit_price"])
    orders += 1
    total += v
    total_units += int(row["units"])
    region[row["region"]] += v
    month[row["date"][:7]] += v
    units[row["product"]] += int(row["units"])
    revenue[row["product"]] += v
report = {
  "orders": orders,
  "total_units": total_units,
  "total_revenue": round(total, 2),
  "revenue_by_region": {k: round(v, 2) for k, v in sorted(region.items())},
  "revenue_by_month": {k: round(v, 2) for k, v in sorted(month.items())},
  "units_by_product": dict(sorted(units.items())),
  "top_product": max(revenue, key=revenue.get),
}
with open("/app/report.json", "w") as f:
  json.dump(report, f, indent=2)
PY
