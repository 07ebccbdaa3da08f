"""Divisor tables from the command line: FDR calibration, SPR recalibration, inspection (paper App. B).

::

    # D_f = q_0.90(N | f) over the valid reports of a trajectory table (.jsonl / .json / .csv)
    python -m rsi_jax.rl.calibrate fdr --trajectories=T.jsonl --out=fdr.json [--quantile=0.9] [--min_samples=1]
        [--fallback_divisor=82] [--source=TEXT] [--phase=NAME]
    # D'_f for the next phase: failure suppression (x2) before long low-reward (x1/4); thresholds from the
    # run config's reward section plus key=value overrides
    python -m rsi_jax.rl.calibrate spr --table=fdr.json --trajectories=T.jsonl --out=spr.json \\
        [--config=configs/base.yml] [reward.long_low_reward_factor=0.5 ...]
    python -m rsi_jax.rl.calibrate show --table=spr.json

The first argument is the command (``fdr``, ``spr``, ``show``). Each of the first two writes the new table (JSON
with per-family provenance) and prints it with its digest. The trajectory table format is described in
:mod:`rsi_jax.rl.outcome_table`, the rules in :mod:`rsi_jax.rl.divisors`. Exit status 0 done, 2 a usage or
config error or a table that cannot be read (one line).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence

from rsi_jax.rl.divisors import (DEFAULT_FALLBACK_DIVISOR, calibrate_fdr_divisors, format_table,
                                 load_divisor_table, recalibrate_spr_divisors)
from rsi_jax.rl.outcome_table import read_outcome_table

PROG = "python -m rsi_jax.rl.calibrate"
COMMANDS = ("fdr", "spr", "show")


@functools.cache
def flag_values():
  """The command line's flags (absl, imported here: the core needs no absl)."""
  from absl import flags

  from rsi_jax import cli
  fv = cli.flag_values()
  flags.DEFINE_string("trajectories", "", "fdr, spr: trajectory table (.jsonl / .json / .csv; spr: with "
                      "turns).", flag_values=fv)
  flags.DEFINE_string("out", "", "fdr, spr: the table to write (JSON).", flag_values=fv)
  flags.DEFINE_string("table", "", "spr: the divisor table the trajectories were scored with; show: the table "
                      "to print.", flag_values=fv)
  flags.DEFINE_float("quantile", 0.90, "fdr: the quantile of total non-hygiene checks per family.",
                     flag_values=fv)
  flags.DEFINE_integer("min_samples", 1, "fdr: valid reports a family needs (fewer: the fallback divisor).",
                       flag_values=fv)
  flags.DEFINE_float("fallback_divisor", DEFAULT_FALLBACK_DIVISOR, "fdr: the divisor of families without "
                     "enough reports.", flag_values=fv)
  flags.DEFINE_string("config", None, "spr: run config YAML whose reward section gives the thresholds "
                      "(default: the schema's defaults).", flag_values=fv)
  flags.DEFINE_string("source", "", "fdr, spr: provenance text (default: the trajectory table's path).",
                      flag_values=fv)
  flags.DEFINE_string("phase", "", "fdr, spr: the phase the table is for.", flag_values=fv)
  return fv


_NEEDS = {"fdr": ("trajectories", "out"), "spr": ("table", "trajectories", "out"), "show": ("table",)}


def main(argv: Sequence[str] | None = None) -> int:
  from rsi_jax import cli
  FLAGS = flag_values()  # noqa: N806
  rest = cli.parse(FLAGS, argv, PROG, __doc__, overrides=False)
  cmd = rest[0] if rest else ""
  if cmd not in COMMANDS:
    cli.fail(PROG, f"the first argument is the command: one of {', '.join(COMMANDS)}"
             + (f" (got {cmd!r})" if cmd else ""))
  overrides = rest[1:]
  if cmd == "show" and overrides and not FLAGS.table:  # the old spelling: show FILE
    cli.fail(PROG, f"show: give the table as --table={overrides[0]}")
  stray = [a for a in overrides if cmd != "spr" or "=" not in a or a.startswith("-")]
  if stray:
    cli.fail(PROG, f"{cmd}: unexpected argument {stray[0]!r}" + (" (spr takes key=value config overrides)"
                                                                  if cmd == "spr" else ""))
  missing = [f"--{k}" for k in _NEEDS[cmd] if not FLAGS[k].value]
  if missing:
    cli.fail(PROG, f"{cmd}: {', '.join(missing)} required")
  try:
    if cmd == "show":
      print(format_table(load_divisor_table(FLAGS.table)))
      return 0
    traj = read_outcome_table(FLAGS.trajectories)
    if cmd == "fdr":
      t = calibrate_fdr_divisors(traj, quantile=FLAGS.quantile, fallback_divisor=FLAGS.fallback_divisor,
                                 min_samples=FLAGS.min_samples, source=FLAGS.source or FLAGS.trajectories,
                                 phase=FLAGS.phase)
    else:
      from rsi_jax.config import ConfigError, load_config
      try:
        cfg = load_config(FLAGS.config, overrides).reward
      except ConfigError as e:
        raise ValueError(str(e)) from None
      t = recalibrate_spr_divisors(load_divisor_table(FLAGS.table), traj, cfg,
                                   source=FLAGS.source or FLAGS.trajectories, phase=FLAGS.phase)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  t.save(FLAGS.out)
  print(format_table(t))
  print(f"wrote {FLAGS.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
