"""The learning check's table: held-out Mean@R / pass@R after each stage of a learn_check run.

Usage: .venv/bin/python scripts/learn_check_table.py RUN_DIR [--wall-seconds S] [--start-label TEXT]
Reads <RUN_DIR>/eval/<phase>/<last step>/summary.json; prints the table and writes <RUN_DIR>/learn_check.json.
When the attempts record the agent's actions and the run's evaluation suite (eval.tasks_dir) is still there,
it also counts why each stage's failed attempts failed (rsi_jax.env.learn_tasks.failure_modes).
"""

import argparse
import json
import sys
from pathlib import Path

from rsi_jax.env.learn_tasks import FAILURE_MODES, failure_modes
from rsi_jax.eval.report import run_stages
from rsi_jax.pipeline.metrics import read_jsonl

LABELS = {"base": "init (random)", "rsr0": "Base (SFT warm start)", "rsr1": "RSR-1", "critic_seed": "critic seed",
          "rpr1": "RPR-1"}


def _heldout_dir(run: Path) -> Path | None:
  """The run's evaluation suite (``eval.tasks_dir`` of its config.yml), if it is still there."""
  import yaml
  cfg = run / "config.yml"
  if not cfg.exists():
    return None
  d = (yaml.safe_load(cfg.read_text()).get("eval") or {}).get("tasks_dir")
  return Path(d) if d and Path(d).is_dir() else None


def _failures(stage_dir: Path, heldout: Path | None) -> dict | None:
  """Failure modes of the stage's attempts (None without the suite or the attempts' actions)."""
  recs = read_jsonl(stage_dir / "attempts.jsonl") if heldout is not None else []
  if not recs or any("actions" not in r for r in recs):
    return None
  return failure_modes(recs, heldout)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("run_dir")
  ap.add_argument("--wall-seconds", type=float, default=None)
  ap.add_argument("--start-label", default=LABELS["base"],
                  help="the stage name of the weights the run started from (default: %(default)s)")
  a = ap.parse_args(argv)
  run = Path(a.run_dir)
  try:
    stages = run_stages(run)
  except FileNotFoundError as e:
    print(f"learn_check_table: {e}", file=sys.stderr)
    return 2
  heldout = _heldout_dir(run)
  rows = []
  for phase, path in stages:
    s = json.loads((Path(path) / "summary.json").read_text())
    rows.append({"stage": a.start_label if phase == "base" else LABELS.get(phase, phase), "phase": phase, "step": Path(path).name,
                 "mean_at_r": s["mean_at_r"], "pass_at_r": s["pass_at_r"], "runs": s["runs"],
                 "n_tasks": s["n_tasks"], "infra_failures": s["infra_failures"],
                 "failures": _failures(Path(path), heldout)})
  r = rows[0]["runs"] if rows else 0
  print(f"held-out strict success ({rows[0]['n_tasks'] if rows else 0} tasks x {r}) -- {run}")
  w = max([24] + [len(x["stage"]) + 2 for x in rows])
  print(f"{'stage':<{w}}{'Mean@' + str(r):>10}{'pass@' + str(r):>10}{'infra':>7}")
  fmt = lambda x: "n/a" if x is None else f"{x:.1f}"  # noqa: E731
  for x in rows:
    print(f"{x['stage']:<{w}}{fmt(x['mean_at_r']):>10}{fmt(x['pass_at_r']):>10}{x['infra_failures']:>7}")
  if any(x["failures"] for x in rows):  # why the failed attempts failed (the action that left the reference)
    head = "failed attempts by first action off the reference"
    print(f"\n{head}{'':<{max(0, w - len(head))}}" + "".join(f"{m:>17}" for m in FAILURE_MODES))
    for x in rows:
      if x["failures"]:
        print(f"{x['stage']:<{max(w, len(head))}}" + "".join(f"{x['failures'][m]:>17}" for m in FAILURE_MODES))
  if a.wall_seconds is not None:
    print(f"wall time {a.wall_seconds / 60:.1f} min")
  (run / "learn_check.json").write_text(json.dumps({"stages": rows, "wall_seconds": a.wall_seconds}, indent=1)
                                        + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
