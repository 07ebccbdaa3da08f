#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import json

stats = {}
for line in open("/app/metrics.jsonl"):
  try:
    rec = json.loads(line)
  except json.JSONDecodeError:
    continue
  if not isinstance(rec, dict):
    continue
  s = stats.setdefault(rec["host"], {"samples": 0, "cpus": [], "mem_max_mb": 0, "down": 0})
  s["samples"] += 1
  if rec["cpu"] is not None:
    s["cpus"].append(rec["cpu"])
  s["mem_max_mb"] = max(s["mem_max_mb"], rec["mem_mb"])
  s["down"] += rec["status"] == "down"
out = {}
for host, s in sorted(stats.items()):
  cpus = s.pop("cpus")
  out[host] = {"samples": s["samples"], "cpu_avg": round(sum(cpus) / len(cpus), 3), "cpu_max": max(cpus),
               "mem_max_mb": s["mem_max_mb"], "down": s["down"]}
json.dump(out, open("/app/host_stats.json", "w"), indent=2)
PY
