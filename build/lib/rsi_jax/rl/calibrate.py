"""Divisor tables from the command line: FDR calibration, SPR recalibration, inspection (paper App. B).

::

    # D_f = q_0.90(N | f) over the valid reports of a trajectory table (.jsonl / .json / .csv)
    python -m rsi_jax.rl.calibrate fdr --trajectories T.jsonl --out fdr.json [--quantile 0.9] [--min-samples 1]
    # D'_f for the next phase: failure suppression (x2) before long low-reward (x1/4); thresholds from the
    # run config's reward section plus key=value overrides
    python -m rsi_jax.rl.calibrate spr --table fdr.json --trajectories T.jsonl --out spr.json \\
        [--config configs/base.yml] [reward.long_low_reward_factor=0.5 ...]
    python -m rsi_jax.rl.calibrate show spr.json

Each writes the new table (JSON with per-family provenance) and prints it with its digest. The trajectory
table format is described in :mod:`rsi_jax.rl.outcome_table`, the rules in :mod:`rsi_jax.rl.divisors`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rsi_jax.rl.divisors import (DEFAULT_FALLBACK_DIVISOR, calibrate_fdr_divisors, format_table,
                                 load_divisor_table, recalibrate_spr_divisors)
from rsi_jax.rl.outcome_table import read_outcome_table


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="python -m rsi_jax.rl.calibrate", description=__doc__.split("\n")[0])
  sub = ap.add_subparsers(dest="cmd", required=True)
  c = sub.add_parser("fdr", help="FDR divisors: quantile of total non-hygiene checks per family")
  c.add_argument("--trajectories", required=True, help="trajectory table (.jsonl / .json / .csv)")
  c.add_argument("--out", required=True)
  c.add_argument("--quantile", type=float, default=0.90)
  c.add_argument("--min-samples", type=int, default=1)
  c.add_argument("--fallback-divisor", type=float, default=DEFAULT_FALLBACK_DIVISOR)
  c.add_argument("--source", default="", help="provenance text (default: the trajectory table's path)")
  c.add_argument("--phase", default="")
  r = sub.add_parser("spr", help="SPR divisors: failure suppression / long low-reward recalibration")
  r.add_argument("--table", required=True, help="the divisor table the trajectories were scored with")
  r.add_argument("--trajectories", required=True, help="trajectory table with turns")
  r.add_argument("--out", required=True)
  r.add_argument("--config", default=None, help="run config YAML whose reward section gives the thresholds")
  r.add_argument("--source", default="")
  r.add_argument("--phase", default="")
  r.add_argument("overrides", nargs="*", help="config overrides, e.g. reward.long_low_reward_turns=30")
  s = sub.add_parser("show", help="print a table")
  s.add_argument("table")
  args = ap.parse_args(argv)
  try:
    if args.cmd == "show":
      print(format_table(load_divisor_table(args.table)))
      return 0
    traj = read_outcome_table(args.trajectories)
    if args.cmd == "fdr":
      t = calibrate_fdr_divisors(traj, quantile=args.quantile, fallback_divisor=args.fallback_divisor,
                                 min_samples=args.min_samples, source=args.source or args.trajectories,
                                 phase=args.phase)
    else:
      from rsi_jax.config import ConfigError, load_config
      try:
        cfg = load_config(args.config, args.overrides).reward
      except ConfigError as e:
        raise ValueError(str(e)) from None
      t = recalibrate_spr_divisors(load_divisor_table(args.table), traj, cfg,
                                   source=args.source or args.trajectories, phase=args.phase)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  t.save(args.out)
  print(format_table(t))
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
