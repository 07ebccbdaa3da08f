#!/bin/bash
# Partly correct (for reward tests): lets moves of unknown SKUs into the report and writes nothing else.
set -euo pipefail
python3 - <<'PY'
import csv
products = {p["sku"]: p for p in csv.DictReader(open("/app/products.csv"))}
stock = {s: int(p["opening"]) for s, p in products.items()}
for m in csv.DictReader(open("/app/stock_moves.csv")):
  stock[m["sku"]] = stock.get(m["sku"], 0) + int(m["qty"])
with open("/app/stock_report.csv", "w") as f:
  f.write("sku,name,category,closing,reorder\n")
  for s in sorted(stock):
    p = products.get(s, {"name": "", "category": "", "reorder_level": "0"})
    f.write(f"{s},{p['name']},{p['category']},{stock[s]},{'yes' if stock[s] <= int(p['reorder_level']) else 'no'}\n")
PY
