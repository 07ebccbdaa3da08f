"""Offline rescoring: one fixed trajectory table scored under several reward configurations (paper §3.4, App. B).

Outcome labels never change; only the allocation of reward does. Per configuration it reports the failed
share of total reward mass, failures scoring >= 1, mean success / failure reward, per-family mean reward, and
the reward standard deviation across trajectories and across family means (population std, ddof = 0). The
paper's numbers on its 4,352 trajectories: failed share 50.09% (FDR) -> 28.72% (SPR), failures >= 1:
158 -> 0, mean success / failure reward 1.01 / 0.41 -> 1.50 / 0.24.

Usage::

    python -m rsi_jax.rl.rescore --trajectories=TRAJECTORIES.jsonl \\
        --reward=FDR=fdr:configs/rewards/fallback-82.json --reward=SPR=spr:spr_table.json \\
        [--json=stats.json] [--plot=per_family.png]

``--reward`` is ``[LABEL=]KIND[:TABLE]`` with KIND ``fdr`` or ``spr`` and TABLE a divisor table file
(omitted: every family uses ``--fallback_divisor``, 82). Without ``--reward``: FDR and SPR, fallback only.
The table format is described in :mod:`rsi_jax.rl.outcome_table`; ``--plot`` draws per-family mean reward
as grouped bars (with Pillow, already a dependency; no matplotlib needed). Exit status 0 done, 2 a usage error
or a table that cannot be read (one line).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
from collections.abc import Sequence

import numpy as np

from rsi_jax.rl.divisors import DEFAULT_FALLBACK_DIVISOR, DivisorTable, load_divisor_table
from rsi_jax.rl.outcome_table import OutcomeTable, read_outcome_table
from rsi_jax.rl.rewards import REWARD_KINDS, score_table


@dataclasses.dataclass(frozen=True)
class RewardSpec:
  label: str
  kind: str
  divisors: DivisorTable

  @classmethod
  def parse(cls, spec: str, fallback_divisor: float = DEFAULT_FALLBACK_DIVISOR) -> "RewardSpec":
    """``[LABEL=]KIND[:TABLE]``."""
    label, _, rest = spec.partition("=") if "=" in spec.split(":", 1)[0] else ("", "", spec)
    kind, _, path = rest.partition(":")
    kind = kind.strip().lower()
    if kind not in REWARD_KINDS:
      raise ValueError(f"--reward {spec!r}: kind must be one of {REWARD_KINDS}, got {kind!r}")
    table = load_divisor_table(path) if path else DivisorTable(
        fallback_divisor=fallback_divisor, kind=kind, source="fallback only")
    return cls(label=label or (f"{kind.upper()}:{path}" if path else kind.upper()), kind=kind, divisors=table)


@dataclasses.dataclass(frozen=True)
class RescoreStats:
  """Statistics of one reward configuration on one trajectory table (NaN where undefined)."""
  label: str
  kind: str
  divisor_table: str  # digest
  trajectories: int
  successes: int
  failures: int
  invalid_reports: int
  infra_failures: int  # excluded rows
  reward_mass: float
  failed_share: float  # sum of failure rewards / sum of all rewards
  failures_reward_ge_1: int
  mean_success_reward: float
  mean_failure_reward: float
  mean_reward: float
  std_trajectory: float  # std of rewards over trajectories
  std_family: float  # std of per-family mean rewards over families
  per_family: dict  # family -> {"n", "successes", "mean_reward", "divisor"}

  def to_dict(self) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in dataclasses.asdict(self).items()}


def rescore(table: OutcomeTable, spec: RewardSpec) -> RescoreStats:
  r = score_table(table, spec.kind, spec.divisors)
  s = table.success.astype(bool)
  fams = sorted(set(table.family.tolist()))
  per_family = {}
  for f in fams:
    m = table.family == f
    per_family[f] = {"n": int(m.sum()), "successes": int(s[m].sum()), "mean_reward": float(r[m].mean()),
                     "divisor": spec.divisors.divisor(f)}
  mass = float(r.sum())
  fam_means = np.array([v["mean_reward"] for v in per_family.values()])
  return RescoreStats(
      label=spec.label, kind=spec.kind, divisor_table=spec.divisors.digest, trajectories=len(table),
      successes=int(s.sum()), failures=int((~s).sum()), invalid_reports=int((~table.valid).sum()),
      infra_failures=table.infra_failures, reward_mass=mass,
      failed_share=float(r[~s].sum()) / mass if mass > 0 else math.nan,
      failures_reward_ge_1=int(((~s) & (r >= 1.0)).sum()),
      mean_success_reward=_mean(r[s]), mean_failure_reward=_mean(r[~s]), mean_reward=_mean(r),
      std_trajectory=float(r.std()) if len(r) else math.nan,
      std_family=float(fam_means.std()) if len(fam_means) else math.nan, per_family=per_family)


def _mean(x) -> float:
  return float(x.mean()) if len(x) else math.nan


def format_report(stats: Sequence[RescoreStats]) -> str:
  if not stats:
    return "no reward configurations"
  s0 = stats[0]
  lines = [f"{s0.trajectories} trajectories: {s0.successes} successes, {s0.failures} failures, "
           f"{s0.invalid_reports} invalid reports (reward = S); {s0.infra_failures} infrastructure failures "
           f"excluded", ""]
  w = max(16, *(len(s.label) for s in stats))  # 16: a table digest

  def row(name, vals):
    return f"{name:<32}" + "".join(f"{v:>{w + 2}}" for v in vals)

  def num(x, fmt):
    return "n/a" if isinstance(x, float) and math.isnan(x) else format(x, fmt)

  lines.append(row("", [s.label for s in stats]))
  lines.append(row("failed share of reward mass", [num(100 * s.failed_share, ".2f") + "%"
                                                   if not math.isnan(s.failed_share) else "n/a" for s in stats]))
  lines.append(row("failures with reward >= 1", [str(s.failures_reward_ge_1) for s in stats]))
  lines.append(row("mean success reward", [num(s.mean_success_reward, ".4f") for s in stats]))
  lines.append(row("mean failure reward", [num(s.mean_failure_reward, ".4f") for s in stats]))
  lines.append(row("mean reward", [num(s.mean_reward, ".4f") for s in stats]))
  lines.append(row("reward std, trajectories", [num(s.std_trajectory, ".4f") for s in stats]))
  lines.append(row("reward std, family means", [num(s.std_family, ".4f") for s in stats]))
  lines.append(row("divisor table", [s.divisor_table for s in stats]))
  lines += ["", "per-family mean reward"]
  fams = list(s0.per_family)
  fw = max([len(f) for f in fams] + [6])
  lines.append(f"{'family':<{fw}}  {'n':>6}  {'succ':>6}" + "".join(f"{s.label:>{w + 2}}" for s in stats))
  for f in fams:
    pf = s0.per_family[f]
    lines.append(f"{f:<{fw}}  {pf['n']:>6}  {pf['successes']:>6}" +
                 "".join(f"{s.per_family[f]['mean_reward']:>{w + 2}.4f}" for s in stats))
  return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- plot

_COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75)]


def plot_per_family(stats: Sequence[RescoreStats], path: str) -> None:
  """Grouped horizontal bars of per-family mean reward, one colour per configuration (PNG via Pillow)."""
  from PIL import Image, ImageDraw, ImageFont

  fams = list(stats[0].per_family)
  font = ImageFont.load_default()
  bar, gap, left, right, top = 10, 8, 12 + 7 * max([len(f) for f in fams] + [6]), 80, 40
  group = bar * len(stats) + gap
  width, height = left + 520 + right, top + group * len(fams) + 40
  vmax = max([v["mean_reward"] for s in stats for v in s.per_family.values()] + [1e-9])
  img = Image.new("RGB", (width, height), "white")
  d = ImageDraw.Draw(img)
  for i, s in enumerate(stats):  # legend
    x = left + i * 130
    d.rectangle([x, 12, x + 12, 24], fill=_COLORS[i % len(_COLORS)])
    d.text((x + 18, 11), s.label[:18], fill="black", font=font)
  for j, f in enumerate(fams):
    y0 = top + j * group
    d.text((8, y0 + (group - gap) / 2 - 6), f, fill="black", font=font)
    for i, s in enumerate(stats):
      v = s.per_family[f]["mean_reward"]
      y = y0 + i * bar
      d.rectangle([left, y, left + 520 * v / vmax, y + bar - 2], fill=_COLORS[i % len(_COLORS)])
      d.text((left + 520 * v / vmax + 4, y - 2), f"{v:.2f}", fill="black", font=font)
  d.line([left, top - 4, left, height - 30], fill="black")
  d.text((left, height - 24), f"per-family mean reward (bar length: 0 .. {vmax:.2f})", fill="black", font=font)
  img.save(path, format="PNG")


# ------------------------------------------------------------------------------------------------------ cli


PROG = "python -m rsi_jax.rl.rescore"
@functools.cache
def flag_values():
  """The command line's flags (absl, imported here: the core needs no absl)."""
  from absl import flags

  from rsi_jax import cli
  fv = cli.flag_values()
  flags.DEFINE_string("trajectories", "", "Trajectory table: .jsonl / .json / .csv (family, passed, total, "
                      "success, valid[, turns, state]; required).", flag_values=fv)
  flags.DEFINE_multi_string("reward", [], "A reward configuration [LABEL=]KIND[:TABLE] (repeatable; default: "
                            "fdr and spr with the fallback divisor).", flag_values=fv)
  flags.DEFINE_float("fallback_divisor", DEFAULT_FALLBACK_DIVISOR, "Divisor for configurations given without a "
                     "table.", flag_values=fv)
  flags.DEFINE_string("json", None, "Also write the statistics as JSON to this path ('-': stdout).",
                      flag_values=fv)
  flags.DEFINE_string("plot", None, "Bar plot (PNG) of per-family mean reward.", flag_values=fv)
  return fv


def main(argv: Sequence[str] | None = None) -> int:
  from rsi_jax import cli
  FLAGS = flag_values()  # noqa: N806
  rest = cli.parse(FLAGS, argv, PROG, __doc__, overrides=False)
  if rest and not FLAGS.trajectories:  # the old spelling: the table as the first argument
    cli.fail(PROG, f"give the trajectory table as --trajectories={rest[0]}")
  cli.no_positional(PROG, rest)
  if not FLAGS.trajectories:
    cli.fail(PROG, "--trajectories: required (the trajectory table)")
  try:
    specs = [RewardSpec.parse(x, FLAGS.fallback_divisor) for x in (FLAGS.reward or ["fdr", "spr"])]
    table = read_outcome_table(FLAGS.trajectories)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if len(table) == 0:
    print("error: the trajectory table has no usable rows", file=sys.stderr)
    return 2
  stats = [rescore(table, s) for s in specs]
  print(format_report(stats))
  if FLAGS.json:
    blob = json.dumps([s.to_dict() for s in stats], indent=2)
    if FLAGS.json == "-":
      print(blob)
    else:
      with open(FLAGS.json, "w") as f:
        f.write(blob + "\n")
  if FLAGS.plot:
    plot_per_family(stats, FLAGS.plot)
    print(f"wrote {FLAGS.plot}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
