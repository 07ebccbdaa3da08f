#!/bin/bash
# Partly correct (for reward tests): counts samples and memory right but leaves the CPU figures at 0.
set -euo pipefail
python3 - <<'PY'
import json
out = {}
for line in open("/app/metrics.jsonl"):
  try:
    rec = json.loads(line)
  except ValueError:
    continue
  s = out.setdefault(rec["host"], {"samples": 0, "cpu_avg": 0, "cpu_max": 0, "mem_max_mb": 0, "down": 0})
  s["samples"] += 1
  s["mem_max_mb"] = max(s["mem_max_mb"], rec["mem_mb"])
  s["down"] += rec["status"] == "down"
json.dump(out, open("/app/host_stats.json", "w"))
PY
