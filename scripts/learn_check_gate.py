"""The learning check's discovery gate: before the plan runs, the Base's sampled success on the suite's validation
split (OUT/val, no held-out task) at the rollout's sampling must reach a floor, since RSR-1 learns only from
discovery episodes that verify and RPR-1 only from a success signal. Below it, the check would spend its half
hour printing zeros; it stops at once and says why.

Usage: .venv/bin/python scripts/learn_check_gate.py SUMMARY_JSON [--min 10]
  SUMMARY_JSON: ``python -m rsi_jax.eval --output=DIR`` 's DIR/summary.json over the validation split.
Exits 0 when Mean@R >= --min (points), 3 when below it or when no attempt was scored (infrastructure), 2 on usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def verdict(summary: dict, floor: float) -> tuple[bool, str]:
  """(passes, the line that says so) for an evaluation summary of the validation split."""
  s = summary.get("sampling") or {}
  at = f"T={s.get('temperature')}, top_p {s.get('top_p')}"
  scored, r = summary.get("scored_attempts", 0), summary.get("runs")
  if not scored:
    return False, (f"discovery gate: no attempt on the validation split was scored ({summary.get('infra_failures', 0)}"
                   f" infrastructure failures, {summary.get('n_refused', 0)} tasks refused): nothing to judge the Base by")
  mean = float(summary["mean_at_r"])
  line = (f"discovery gate: the Base solves {mean:.1f}% of {scored} sampled attempts on {summary['n_tasks']} "
          f"validation tasks (Mean@{r}, {at}); the check needs >= {floor:g}%")
  if mean < floor:
    return False, (line + ": below it, discovery would verify (almost) nothing for RSR-1 to learn from and RPR-1 "
                   "would have no success signal, so the check stops here (a Base that solves some of these tasks "
                   "is the premise; --no-gate runs it anyway)")
  return True, line


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("summary")
  ap.add_argument("--min", type=float, default=10.0, help="floor on the validation Mean@R, in points")
  a = ap.parse_args(argv)
  try:
    summary = json.loads(Path(a.summary).read_text())
  except (OSError, ValueError) as e:
    print(f"learn_check_gate: cannot read {a.summary}: {e}", file=sys.stderr)
    return 2
  ok, line = verdict(summary, a.min)
  print(line, file=sys.stdout if ok else sys.stderr)
  return 0 if ok else 3


if __name__ == "__main__":
  sys.exit(main())
