"""Offline rescoring: statistics checked against an independent plain-Python computation."""

import csv
import json
import math
import statistics

import numpy as np
import pytest

from rsi_jax.rl.divisors import DivisorTable, FamilyDivisor
from rsi_jax.rl.outcome_table import OutcomeTable, read_outcome_table
from rsi_jax.rl.rescore import RewardSpec, main, rescore

# family, passed, total, success, valid, turns (None = unknown)
ROWS = [
    ("alpha", 10, 12, 1, True, 30), ("alpha", 12, 12, 0, True, 80), ("alpha", 0, 12, 0, True, 5),
    ("alpha", 3, 12, 0, False, 12),  # invalid report: reward = S = 0 under both
    ("beta", 90, 120, 0, True, 60), ("beta", 120, 120, 1, True, 44), ("beta", 100, 120, 0, True, None),
    ("gamma", 1, 3, 0, True, 2), ("gamma", 3, 3, 1, False, 3),  # invalid success: reward 1 under both
    ("delta", 200, 400, 0, True, 100), ("delta", 400, 400, 1, True, 90), ("delta", 82, 400, 0, True, 70),
]
INFRA_ROWS = 2
FDR_TABLE = DivisorTable({"alpha": FamilyDivisor(12.0, 30), "beta": FamilyDivisor(110.0, 30),
                          "gamma": FamilyDivisor(3.0, 30)}, fallback_divisor=82.0, kind="fdr")  # delta: fallback
SPR_TABLE = DivisorTable({"alpha": FamilyDivisor(24.0, 30), "beta": FamilyDivisor(27.5, 30),
                          "delta": FamilyDivisor(20.5, 30)}, fallback_divisor=82.0, kind="spr")  # gamma: fallback


def expected_stats(kind, table):
  """The statistics, computed the slow obvious way."""
  rewards, succ = [], []
  fam_rewards = {}
  for fam, p, n, s, valid, _ in ROWS:
    d = table.families[fam].divisor if fam in table.families else 82.0
    if not valid:
      r = float(s)
    elif kind == "fdr":
      r = max(p / d, 0.0)
    else:
      r = s + p / (p + d)
    rewards.append(r)
    succ.append(s)
    fam_rewards.setdefault(fam, []).append(r)
  fail_r = [r for r, s in zip(rewards, succ) if s == 0]
  succ_r = [r for r, s in zip(rewards, succ) if s == 1]
  fam_means = {f: sum(v) / len(v) for f, v in fam_rewards.items()}
  return {
      "failed_share": sum(fail_r) / sum(rewards),
      "failures_reward_ge_1": sum(1 for r in fail_r if r >= 1),
      "mean_success_reward": sum(succ_r) / len(succ_r),
      "mean_failure_reward": sum(fail_r) / len(fail_r),
      "mean_reward": sum(rewards) / len(rewards),
      "std_trajectory": statistics.pstdev(rewards),
      "std_family": statistics.pstdev(fam_means.values()),
      "per_family": fam_means,
  }


def write_table(tmp_path, fmt="jsonl"):
  rows = [dict(family=f, passed=p, total=n, success=s, valid=v, turns=t, task=f"t{i}")
          for i, (f, p, n, s, v, t) in enumerate(ROWS)]
  rows += [dict(family="alpha", success=0, valid=False, state="infra_failure")] * INFRA_ROWS
  path = tmp_path / f"traj.{fmt}"
  if fmt == "jsonl":
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  else:
    with open(path, "w", newline="") as f:
      w = csv.DictWriter(f, fieldnames=["family", "passed", "total", "success", "valid", "turns", "state",
                                        "task"])
      w.writeheader()
      for r in rows:
        w.writerow({k: ("" if v is None else str(v).lower() if isinstance(v, bool) else v)
                    for k, v in r.items()})
  return path


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_read_table(tmp_path, fmt):
  t = read_outcome_table(write_table(tmp_path, fmt))
  assert len(t) == len(ROWS) and t.infra_failures == INFRA_ROWS
  assert t.family.tolist() == [r[0] for r in ROWS]
  assert t.success.tolist() == [r[3] for r in ROWS]
  assert t.valid.tolist() == [r[4] for r in ROWS]
  assert t.passed.tolist() == [r[1] if r[4] else 0 for r in ROWS]
  assert math.isnan(t.turns[6]) and t.turns[0] == 30


@pytest.mark.parametrize("kind, table", [("fdr", FDR_TABLE), ("spr", SPR_TABLE), ("spr", FDR_TABLE)])
def test_rescore_matches_independent_computation(tmp_path, kind, table):
  t = read_outcome_table(write_table(tmp_path))
  got = rescore(t, RewardSpec("x", kind, table))
  want = expected_stats(kind, table)
  for k in ("failed_share", "mean_success_reward", "mean_failure_reward", "mean_reward", "std_trajectory",
            "std_family"):
    assert getattr(got, k) == pytest.approx(want[k], rel=1e-12), k
  assert got.failures_reward_ge_1 == want["failures_reward_ge_1"]
  assert {f: v["mean_reward"] for f, v in got.per_family.items()} == pytest.approx(want["per_family"], rel=1e-12)
  assert (got.trajectories, got.successes, got.failures, got.invalid_reports, got.infra_failures) == (
      12, 4, 8, 2, INFRA_ROWS)
  if kind == "spr":
    assert got.failures_reward_ge_1 == 0


def test_fdr_has_high_reward_failures_and_spr_none():
  t = OutcomeTable.from_rows([dict(family=f, passed=p, total=n, success=s, valid=v) for f, p, n, s, v, _ in ROWS])
  fdr = rescore(t, RewardSpec("FDR", "fdr", FDR_TABLE))
  spr = rescore(t, RewardSpec("SPR", "spr", SPR_TABLE))
  assert fdr.failures_reward_ge_1 == 3  # alpha 12/12, delta 200/82 and 82/82
  assert spr.failures_reward_ge_1 == 0
  assert spr.failed_share < fdr.failed_share


def test_cli_prints_and_writes_json_and_plot(tmp_path, capsys):
  traj = write_table(tmp_path)
  FDR_TABLE.save(tmp_path / "fdr.json")
  SPR_TABLE.save(tmp_path / "spr.json")
  out_json, out_png = tmp_path / "stats.json", tmp_path / "fam.png"
  rc = main([f"--trajectories={traj}", "--reward", f"FDR=fdr:{tmp_path / 'fdr.json'}",
             "--reward", f"SPR=spr:{tmp_path / 'spr.json'}",
             "--reward", "spr", "--json", str(out_json), "--plot", str(out_png)])
  assert rc == 0
  text = capsys.readouterr().out
  for needle in ("failed share of reward mass", "failures with reward >= 1", "mean success reward",
                 "mean failure reward", "reward std, trajectories", "reward std, family means", "FDR", "SPR",
                 "alpha", "delta", f"{INFRA_ROWS} infrastructure failures excluded"):
    assert needle in text, needle
  want = expected_stats("fdr", FDR_TABLE)
  assert f"{100 * want['failed_share']:.2f}%" in text
  blob = json.loads(out_json.read_text())
  assert [b["label"] for b in blob] == ["FDR", "SPR", "SPR"]
  assert blob[0]["failed_share"] == pytest.approx(want["failed_share"], rel=1e-12)
  assert blob[2]["per_family"]["gamma"]["divisor"] == 82.0  # plain "spr": fallback for every family
  assert blob[2]["mean_failure_reward"] == pytest.approx(expected_stats("spr", DivisorTable())["mean_failure_reward"])
  from PIL import Image
  with Image.open(out_png) as im:
    assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100


def test_cli_defaults_and_errors(tmp_path, capsys):
  traj = write_table(tmp_path, "csv")
  assert main([f"--trajectories={traj}", "--json", "-"]) == 0
  out = capsys.readouterr().out
  blob = json.loads(out[out.index("[\n"):])
  assert [b["kind"] for b in blob] == ["fdr", "spr"]
  assert main([f"--trajectories={traj}", "--reward", "binary"]) == 2
  assert main([f"--trajectories={traj}", "--reward", f"fdr:{tmp_path / 'missing.json'}"]) == 2
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"family": "a", "passed": 5, "total": 3, "success": 0, "valid": true}\n')
  assert main([f"--trajectories={bad}"]) == 2
  assert "passed (5) > total (3)" in capsys.readouterr().err


@pytest.mark.parametrize("row, match", [
    (dict(passed=1, total=2, success=0, valid=True), "missing column 'family'"),
    (dict(family="a", total=2, success=0, valid=True), "missing column 'passed'"),
    (dict(family="a", passed=-1, total=2, success=0, valid=True), "integer count"),
    (dict(family="a", passed=1.5, total=2, success=0, valid=True), "integer count"),
    (dict(family="a", passed=0, total=0, success=0, valid=True), "total > 0"),
    (dict(family="a", passed=1, total=2, success=2, valid=True), "success"),
    (dict(family="a", passed=1, total=2, success=0, valid="maybe"), "valid"),
    (dict(family="a", passed=1, total=2, success=0, valid=True, turns=-3), "turns"),
    (dict(family="a", passed=1, total=2, success=0, valid=True, state="weird"), "state"),
    (dict(family="a", success=0, valid=True, state="invalid_report"), "invalid_report but valid"),
])
def test_table_row_validation(row, match):
  with pytest.raises(ValueError, match=match):
    OutcomeTable.from_rows([row])


def test_reward_spec_parsing(tmp_path):
  FDR_TABLE.save(tmp_path / "a=b.json")
  s = RewardSpec.parse(f"my label=fdr:{tmp_path / 'a=b.json'}")
  assert s.label == "my label" and s.kind == "fdr" and s.divisors.digest == FDR_TABLE.digest
  s = RewardSpec.parse("SPR", fallback_divisor=10.0)
  assert (s.label, s.kind, s.divisors.fallback_divisor, len(s.divisors)) == ("SPR", "spr", 10.0, 0)
  np.testing.assert_array_equal(s.divisors.lookup(["x"]), [10.0])
