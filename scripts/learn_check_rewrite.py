"""The learning check's rewrite comparison: RSR-1 with the runbook stage on (the actor plans runbooks, the review
gate filters them, fresh executions under them, projection, SFT) beside the run's own RSR-1 with it off
(verified self-imitation), both started from the run's Base checkpoint on the same tasks and seed.

Usage: .venv/bin/python scripts/learn_check_rewrite.py RUN_DIR [--num-runbooks N] [--broken] [key=value ...]
       .venv/bin/python scripts/learn_check_rewrite.py --compare SELF_IMITATION_RUN REWRITE_RUN

Runs RSR-1 from RUN_DIR's Base (its ``rsr0`` checkpoint, or the imported stand-in Base of a ``--stand-in-base``
run) with RUN_DIR's config, RSR-1's phase overrides, the
actor writing ``N`` runbooks per discovered episode (default 2) and the command line's ``key=value``
overrides, in the run ``<name>_rewrite``; its in-training evaluation measures the starting weights (``base``,
step 0: Base again, which must equal RUN_DIR's Base row) and the end of the phase. Then prints, for both
variants, the funnel's counts per stage, the review gate's rejections by reason, the turns per accepted
trajectory and held-out Mean@R / pass@R, and writes ``<name>_rewrite/rewrite_comparison.json``.

``--broken``: the broken variant (run by hand, in ``<name>_rewrite_broken``): the one change is in the code path,
the funnel's gate into Q_clean inverted (``rsi_jax.rsr.funnel.execution_verified`` replaced), so RSR-1 trains
on the fresh executions the verifier *rejected*; a correct learning path shows it not improving on Base.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from rsi_jax.env.transcripts import read_transcripts
from rsi_jax.pipeline.metrics import read_jsonl

sys.path.insert(0, str(Path(__file__).parent))
import learn_check_rpr  # noqa: E402
import learn_check_table  # noqa: E402

STAGES = ("attempted", "discovered", "planned", "reviewed", "review_rejected", "executed", "verified",
          "leak_screened", "accepted")


def variant(run: Path, phase: str) -> dict:
  """One variant's funnel counts, turns per accepted trajectory and held-out result."""
  folder = run / "phases" / phase
  manifest = json.loads((folder / "rsr_manifest.json").read_text())
  accepted = {r["episode_id"] for r in read_jsonl(folder / "q_clean.jsonl")}
  turns = [len(r["turns"]) for f in sorted((folder / "episodes").glob("*.jsonl.gz")) for r in read_transcripts(f)
           if r["episode_id"] in accepted]
  held, held_from = last_evaluation(run, phase), phase
  if held is None and manifest["empty_reason"]:  # the phase trained nothing: its output is the weights it started from
    held, held_from = last_evaluation(run, "base"), "base"
  return {"run": str(run), "policy": manifest["policy"], "num_runbooks": manifest["settings"]["num_runbooks"],
          "stages": {k: manifest["stages"].get(k, 0) for k in STAGES},
          "rejected": manifest["stages"].get("rejected", {}), "empty_reason": manifest["empty_reason"],
          "turns_per_accepted": statistics.fmean(turns) if turns else None, "accepted_with_turns": len(turns),
          "mean_at_r": held["mean_at_r"] if held else None, "pass_at_r": held["pass_at_r"] if held else None,
          "runs": held["runs"] if held else configured_runs(run), "held_out_from": held_from if held else None}


def last_evaluation(run: Path, phase: str) -> dict | None:
  """The summary of ``phase``'s last evaluated step in ``run`` (``base``: the starting weights), or None."""
  steps = sorted((run / "eval" / phase).glob("*/summary.json"), key=lambda p: int(p.parent.name))
  return json.loads(steps[-1].read_text()) if steps else None


def configured_runs(run: Path) -> int | None:
  """R of Mean@R as the run's config sets it (``eval.repeats``), for a run with no evaluation to read it from."""
  return (run_config(run).get("eval") or {}).get("repeats")


def run_config(run: Path) -> dict:
  """``run``'s config.yml as written ({} without one)."""
  import yaml
  return (yaml.safe_load((run / "config.yml").read_text()) if (run / "config.yml").exists() else None) or {}


def rejected_only(res) -> bool:
  """The broken variant's gate: a fresh execution that ran (not an infrastructure failure, which the funnel
  counts before asking) and failed its verifier."""
  return res.success != 1


def base_weights(run: Path) -> list[str]:
  """The overrides that start RSR-1 from ``run``'s Base: its rsr0 checkpoint, or none when the run started from
  an imported Base (``scripts/learn_check.sh --stand-in-base``: model.hf_path, and RSR-1 is the first phase)."""
  base = run / "checkpoints" / "rsr0"
  if base.is_dir():
    return [f"pipeline.actor_from={{rsr1: {base}}}"]
  cfg = run_config(run)
  if (cfg.get("model") or {}).get("hf_path") and (cfg.get("pipeline") or {}).get("phases", [None])[0] == "rsr1":
    return []
  raise FileNotFoundError(f"no Base in {run}: neither an rsr0 checkpoint nor an imported model.hf_path that RSR-1 "
                          f"starts from (run scripts/learn_check.sh first)")


def run_rewrite(run: Path, num_runbooks: int, overrides: list[str], broken: bool = False) -> tuple[int, Path]:
  """RSR-1 with the runbook stage on, from ``run``'s Base checkpoint, in ``<run>_rewrite`` (``broken``:
  trained on the rejected executions, in ``<run>_rewrite_broken``)."""
  start = base_weights(run)
  name = f"{run.name}_rewrite" + ("_broken" if broken else "")
  if broken:
    from rsi_jax.rsr import funnel
    funnel.execution_verified = rejected_only  # the deliberate bug
  rc = learn_check_rpr.rerun(run, "rsr1", name, [*start, "rsr.policy=actor", f"rsr.num_runbooks={num_runbooks}",
                                                 *overrides])
  return rc, run.parent / name


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  phase = "rsr1"
  try:
    if argv[:1] == ["--compare"] and len(argv) == 3:
      self_run, rewrite_run = Path(argv[1]), Path(argv[2])
    elif argv and not argv[0].startswith("-"):
      n, rest = 2, argv[1:]
      broken = "--broken" in rest
      rest = [a for a in rest if a != "--broken"]
      if rest[:1] == ["--num-runbooks"] and len(rest) > 1 and rest[1].isdigit():
        n, rest = int(rest[1]), rest[2:]
      self_run = Path(argv[0]).resolve()
      rc, rewrite_run = run_rewrite(self_run, n, rest, broken)
      if rc != 0:
        return rc
      learn_check_table.main([str(rewrite_run), "--start-label", "Base (the run's own)"])
    else:
      print(__doc__, file=sys.stderr)
      return 2
    rows = {"self-imitation": variant(self_run, phase), "rewrite": variant(rewrite_run, phase)}
  except FileNotFoundError as e:
    print(f"learn_check_rewrite: {e}", file=sys.stderr)
    return 2
  fmt = lambda x, f="{:.1f}": "n/a" if x is None else f.format(x)  # noqa: E731
  print(f"\nRSR-1 funnel ({phase}): runbook stage off (self-imitation) vs on (rewrite)")
  print(f"{'':<28}{'self-imitation':>16}{'rewrite':>12}")
  for k in STAGES:
    print(f"{k:<28}{rows['self-imitation']['stages'][k]:>16}{rows['rewrite']['stages'][k]:>12}")
  for reason in sorted(set(rows["self-imitation"]["rejected"]) | set(rows["rewrite"]["rejected"])):
    print(f"{'  rejected: ' + reason:<28}{rows['self-imitation']['rejected'].get(reason, 0):>16}"
          f"{rows['rewrite']['rejected'].get(reason, 0):>12}")
  print(f"{'turns per accepted':<28}{fmt(rows['self-imitation']['turns_per_accepted'], '{:.2f}'):>16}"
        f"{fmt(rows['rewrite']['turns_per_accepted'], '{:.2f}'):>12}")
  r = rows["rewrite"]["runs"] or rows["self-imitation"]["runs"]
  for key, label in (("mean_at_r", f"held-out Mean@{r}"), ("pass_at_r", f"held-out pass@{r}")):
    print(f"{label:<28}{fmt(rows['self-imitation'][key]):>16}{fmt(rows['rewrite'][key]):>12}")
  for name, row in rows.items():
    if row["empty_reason"]:
      print(f"{name}: {row['empty_reason']}" + (" (its held-out row is the Base's: the weights are unchanged)"
                                                if row["held_out_from"] == "base" else ""))
  (rewrite_run / "rewrite_comparison.json").write_text(json.dumps(rows, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
