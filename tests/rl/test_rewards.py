"""FDR / SPR (Eq. 6-7), divisor tables, FDR calibration and SPR recalibration (paper §2.2, App. B)."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsi_jax.config import RewardConfig, load_config
from rsi_jax.rl.ctrf import CTRFReport, verification_outcome
from rsi_jax.rl.divisors import (DivisorTable, FamilyDivisor, calibrate_fdr_divisors, divisor_table_from_config,
                                 load_divisor_table, recalibrate_spr_divisors)
from rsi_jax.rl.calibrate import main as calibrate_main
from rsi_jax.rl.outcome_table import OutcomeTable
from rsi_jax.rl.rewards import fdr_reward, outcome_rewards, reward_fn, score_table, spr_reward

# --------------------------------------------------------------------------------------------- formulas

P = np.array([0, 3, 10, 82, 200, 7, 7, 0])
S = np.array([0, 0, 1, 0, 1, 1, 0, 1])
D = np.array([10.0, 10.0, 10.0, 82.0, 82.0, 1.0, 1.0, 5.0])
V = np.array([True, True, True, True, True, False, False, True])


def test_fdr_formula():
  want = [0 / 10, 3 / 10, 10 / 10, 82 / 82, 200 / 82, 1.0, 0.0, 0 / 5]  # invalid rows -> S
  np.testing.assert_allclose(fdr_reward(P, S, D, V), want, rtol=0, atol=0)


def test_spr_formula():
  want = [0.0, 3 / 13, 1 + 10 / 20, 82 / 164, 1 + 200 / 282, 1.0, 0.0, 1.0]
  np.testing.assert_allclose(spr_reward(P, S, D, V), want, rtol=1e-15)


def test_fdr_has_no_upper_clip_and_constant_marginal_credit():
  r = fdr_reward(np.arange(0, 500), 0, 82.0, True)
  np.testing.assert_allclose(np.diff(r), 1 / 82)
  assert r[-1] > 6


def test_jax_matches_numpy_and_jits():
  args = [jnp.asarray(P), jnp.asarray(S), jnp.asarray(D), jnp.asarray(V)]
  for fn in (fdr_reward, spr_reward):
    ref = fn(P, S, D, V)
    got = fn(*args)
    assert isinstance(got, jax.Array) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.jit(fn)(*args)), ref, rtol=1e-6)
  assert spr_reward(P, S, D, V).dtype == np.float64


def test_broadcasting_scalar_divisor_and_validity():
  r = spr_reward(np.array([[0, 1], [2, 3]]), np.array([0, 1]), 1.0, True)
  np.testing.assert_allclose(r, [[0, 1 + 1 / 2], [2 / 3, 1 + 3 / 4]])
  assert float(fdr_reward(5, 1, 10.0, False)) == 1.0


@pytest.mark.parametrize("fn", [fdr_reward, spr_reward])
@pytest.mark.parametrize("bad, match", [
    (dict(passed=-1), "passed counts"),
    (dict(passed=np.array([1.0, np.nan])), "passed counts"),
    (dict(divisor=0.0), "divisors"),
    (dict(divisor=np.array([1.0, -2.0])), "divisors"),
    (dict(divisor=np.inf), "divisors"),
    (dict(success=2), "success"),
    (dict(success=0.5), "success"),
    (dict(report_valid=2), "report_valid"),
    (dict(passed=jnp.array([-1.0])), "passed counts"),  # concrete JAX input: still checked
    (dict(passed=np.array(["a"])), "numeric"),
])
def test_validation_errors(fn, bad, match):
  kw = dict(passed=1, success=0, divisor=10.0, report_valid=True)
  kw.update(bad)
  with pytest.raises(ValueError, match=match):
    fn(**kw)


def test_no_validation_under_jit():
  # Inside jit the values are unknown; the formula is applied as is (no error, no host sync).
  r = jax.jit(fdr_reward)(jnp.array([-1.0]), jnp.array([0.0]), jnp.array([10.0]), jnp.array([True]))
  np.testing.assert_allclose(np.asarray(r), [0.0])  # max(P / D, 0) clips the (invalid) negative count


def test_reward_fn():
  assert reward_fn("fdr") is fdr_reward and reward_fn("spr") is spr_reward
  with pytest.raises(ValueError, match="unknown reward kind"):
    reward_fn("bin")


counts = st.integers(min_value=0, max_value=10**7)
divisors = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


_spr_jit = jax.jit(spr_reward)


@settings(max_examples=100, deadline=None)
@given(p_fail=st.lists(counts, min_size=16, max_size=16), p_succ=st.lists(counts, min_size=16, max_size=16),
       d=divisors)
def test_spr_ordering_property(p_fail, p_succ, d):
  """Valid reports: every failure < 1 <= every success, 0 <= R < 2 (numpy float64, JAX float32 eager + jit)."""
  zeros, ones, valid = np.zeros(16), np.ones(16), np.ones(16, bool)
  for fn, xp in ((spr_reward, np), (spr_reward, jnp), (_spr_jit, jnp)):
    fail = np.asarray(fn(xp.asarray(p_fail), xp.asarray(zeros), xp.full(16, d), xp.asarray(valid)))
    succ = np.asarray(fn(xp.asarray(p_succ), xp.asarray(ones), xp.full(16, d), xp.asarray(valid)))
    assert fail.max() < 1 <= succ.min()
    assert fail.min() >= 0 and succ.max() < 2


@settings(max_examples=200, deadline=None)
@given(p=counts, d=divisors, s=st.integers(0, 1))
def test_spr_success_gets_exactly_one_more_unit_and_fallbacks(p, d, s):
  fail, succ = float(spr_reward(p, 0, d, True)), float(spr_reward(p, 1, d, True))
  assert succ - fail == pytest.approx(1.0, abs=1e-12)
  assert fail == pytest.approx(p / (p + d), rel=1e-12)
  # Invalid report: both rewards are S whatever P and D are.
  assert float(spr_reward(p, s, d, False)) == s
  assert float(fdr_reward(p, s, d, False)) == s
  assert float(fdr_reward(p, s, d, True)) == p / d


def test_spr_extreme_counts_keep_the_bound():
  # P / (P + D) rounds to 1 in float; the cap keeps failure < 1 and success < 2.
  assert float(spr_reward(1e30, 0, 1.0, True)) < 1.0
  assert float(spr_reward(1e30, 1, 1.0, True)) < 2.0
  assert float(spr_reward(jnp.float32(1e9), jnp.float32(1), 0.25, True)) < 2.0
  assert float(spr_reward(jnp.float32(1e9), jnp.float32(0), 0.25, True)) < 1.0


def test_outcome_rewards_mask_infra_failures():
  from tests.rl.test_ctrf import SPEC_FORM  # passed 2, total 6
  outs = [verification_outcome(SPEC_FORM, "1"), verification_outcome(SPEC_FORM, "0"),
          verification_outcome("{bad", "1"), verification_outcome(SPEC_FORM, "1", infra_error="container died")]
  table = DivisorTable({"a": FamilyDivisor(4.0, 10)})
  r, m = outcome_rewards(outs, ["a", "b", "a", "a"], "spr", table)
  np.testing.assert_allclose(r, [1 + 2 / 6, 2 / 84, 1.0, 0.0], rtol=1e-6)
  np.testing.assert_array_equal(m, [1, 1, 1, 0])
  assert r.dtype == np.float32
  r, _ = outcome_rewards(outs, ["a", "b", "a", "a"], "fdr", table)
  np.testing.assert_allclose(r, [2 / 4, 2 / 82, 1.0, 0.0], rtol=1e-6)


# ------------------------------------------------------------------------------------------ divisor table


def test_table_lookup_fallback_roundtrip_and_digest(tmp_path):
  t = DivisorTable({"b": FamilyDivisor(7.5, 12, "hist"), "a": FamilyDivisor(3.0, 4, "hist")},
                   fallback_divisor=82.0, kind="fdr", phase="rpr1", source="unit test")
  np.testing.assert_array_equal(t.lookup(["a", "zzz", "b", "a"]), [3.0, 82.0, 7.5, 3.0])
  assert t.lookup([]).shape == (0,)
  assert list(t.families) == ["a", "b"]
  path = t.save(tmp_path / "t.json")
  back = load_divisor_table(path)
  assert back == t and back.digest == t.digest
  with pytest.raises(TypeError):
    t.families["c"] = FamilyDivisor(1.0)  # frozen within a phase
  with pytest.raises(dataclasses.FrozenInstanceError):
    t.fallback_divisor = 1.0
  changed = DivisorTable({**t.families, "a": FamilyDivisor(3.5, 4, "hist")}, phase="rpr1", source="unit test")
  assert changed.digest != t.digest


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.update(format="x"), "format"),
    (lambda d: d.update(extra=1), "unknown key 'extra'"),
    (lambda d: d["families"]["a"].update(divisor=0), "family 'a'.*divisor"),
    (lambda d: d["families"]["a"].update(divisor=float("nan")), "divisor"),
    (lambda d: d["families"]["a"].update(samples=-1), "samples"),
    (lambda d: d["families"]["a"].update(rule="tripled"), "rule"),
    (lambda d: d["families"]["a"].update(colour="red"), "family 'a'"),
    (lambda d: d.update(fallback_divisor=0), "fallback_divisor"),
    (lambda d: d.update(kind="bin"), "kind"),
])
def test_table_file_validation(tmp_path, mutate, match):
  d = DivisorTable({"a": FamilyDivisor(2.0, 3)}).to_dict()
  mutate(d)
  p = tmp_path / "t.json"
  p.write_text(json.dumps(d))
  with pytest.raises(ValueError, match=match):
    load_divisor_table(p)


def test_shipped_fallback_table_and_config():
  t = load_divisor_table("configs/rewards/fallback-82.json")
  assert len(t) == 0 and t.fallback_divisor == 82.0 and t.lookup(["any"])[0] == 82.0
  assert divisor_table_from_config(RewardConfig()).lookup(["x"])[0] == 82.0
  cfg = RewardConfig(divisor_table="configs/rewards/fallback-82.json")
  assert divisor_table_from_config(cfg).digest == t.digest
  # base.yml mirrors the reward section's defaults.
  assert load_config("configs/base.yml").reward == RewardConfig()


def test_reward_config_validation():
  from rsi_jax.config import ConfigError, with_overrides
  base = load_config(None)
  with pytest.raises(ConfigError, match="reward.hygiene_patterns"):
    with_overrides(base, ["reward.hygiene_patterns=[\"(\"]"])
  with pytest.raises(ConfigError, match="reward.suppression_factor"):
    with_overrides(base, ["reward.suppression_factor=0"])
  with pytest.raises(ConfigError, match="reward.high_reward_failure_share"):
    with_overrides(base, ["reward.high_reward_failure_share=1.5"])
  cfg = with_overrides(base, ["reward.hygiene_patterns=[\"::test_hygiene_\", \"lint\"]"])
  assert cfg.reward.hygiene_patterns == ("::test_hygiene_", "lint")


# -------------------------------------------------------------------------------------------- calibration


def test_fdr_calibration_matches_numpy_quantile():
  rng = np.random.default_rng(0)
  fams = {f"fam{i}": rng.integers(1, 800, size=rng.integers(1, 60)).tolist() for i in range(12)}
  rows = [dict(family=f, passed=0, total=n, success=0, valid=True) for f, ns in fams.items() for n in ns]
  rows += [dict(family="fam0", passed=0, total=10**6, success=1, valid=False)]  # invalid: not in history
  t = calibrate_fdr_divisors(OutcomeTable.from_rows(rows), quantile=0.9, source="synthetic")
  assert t.kind == "fdr" and set(t.families) == set(fams)
  for f, ns in fams.items():
    assert t.divisor(f) == np.quantile(np.array(ns, np.float64), 0.9)
    assert t.families[f].samples == len(ns) and t.families[f].source == "synthetic"
  assert t.divisor("unseen") == 82.0
  # (family, N) pairs and (family, CTRFReport) give the same table; other quantiles and methods pass through.
  pairs = [(f, n) for f, ns in fams.items() for n in ns]
  assert calibrate_fdr_divisors(pairs, source="synthetic").families == t.families
  reports = [(f, CTRFReport(True, passed=0, failed=n)) for f, n in pairs] + [("fam1", CTRFReport.invalid("x"))]
  assert calibrate_fdr_divisors(reports, source="synthetic").families == t.families
  t5 = calibrate_fdr_divisors(pairs, quantile=0.5, method="lower")
  for f, ns in fams.items():
    assert t5.divisor(f) == np.quantile(np.array(ns, np.float64), 0.5, method="lower")


def test_fdr_calibration_min_samples_and_errors():
  t = calibrate_fdr_divisors([("a", 5), ("a", 7), ("b", 3)], min_samples=2)
  assert "a" in t and "b" not in t and any("b:" in n for n in t.notes)
  with pytest.raises(ValueError, match="total must be an integer >= 1"):
    calibrate_fdr_divisors([("a", 0)])
  with pytest.raises(ValueError, match="quantile"):
    calibrate_fdr_divisors([("a", 1)], quantile=0.0)


# ------------------------------------------------------------------------------------------ recalibration


def _rows(family, n, *, success=0, passed=0, total=40, turns=10, valid=True):
  return [dict(family=family, passed=passed, total=total, success=success, valid=valid, turns=turns)] * n


def recalibration_fixture():
  """Families built so that exactly one rule fires for each (D' = 10 for all old families)."""
  rows = []
  # both: 2 of 8 failures (25%) score P/(P+10) = 0.6 >= 0.5, mean reward 0.15 < 0.25, median turns 50 >= 40
  rows += _rows("both", 2, passed=15, turns=50) + _rows("both", 6, passed=0, turns=50)
  # suppress: 3 of 6 failures score 0.5 (P = 10), short episodes
  rows += _rows("suppress", 3, passed=10, turns=5) + _rows("suppress", 3, passed=1, turns=5) + _rows(
      "suppress", 2, success=1, passed=20, turns=5)
  # longlow: long, failures score 1/11 only, mean < 0.25
  rows += _rows("longlow", 10, passed=1, turns=60)
  # long but not low: half succeed
  rows += _rows("longok", 4, passed=1, turns=60) + _rows("longok", 4, success=1, passed=20, turns=60)
  # below the suppression share: 1 of 5 failures (20%) high
  rows += _rows("fewhigh", 1, passed=30) + _rows("fewhigh", 4, passed=0)
  # invalid reports (reward = S = 0) never count as high-reward failures
  rows += _rows("invalid", 6, passed=0, total=0, valid=False, turns=10)
  # too few trajectories
  rows += _rows("tiny", 2, passed=30, turns=90)
  # a family the old table does not know: newly calibrated from its valid totals
  rows += [dict(family="fresh", passed=1, total=n, success=0, valid=True, turns=3) for n in (4, 8, 15, 16, 23, 42)]
  old = DivisorTable({f: FamilyDivisor(10.0, 50, "fdr history") for f in (
      "both", "suppress", "longlow", "longok", "fewhigh", "invalid", "tiny", "absent")}, kind="fdr")
  return old, OutcomeTable.from_rows(rows)


def test_recalibration_rules_and_precedence():
  old, table = recalibration_fixture()
  cfg = RewardConfig()  # threshold 0.5, share 0.25, x2, long >= 40 turns, mean < 0.25, x0.25, min 5
  new = recalibrate_spr_divisors(old, table, cfg, source="steps 0-8", phase="rpr2")
  e = new.families
  assert new.kind == "spr" and new.parent == old.digest and new.phase == "rpr2"
  # Failure suppression wins where both rules match, and says so.
  assert (e["both"].rule, e["both"].divisor, e["both"].old_divisor) == ("failure_suppression", 20.0, 10.0)
  assert "takes precedence" in e["both"].reason and "long low-reward rule also matched" in e["both"].reason
  assert e["both"].stats["high_reward_failures"] == 2 and e["both"].stats["median_turns"] == 50
  assert (e["suppress"].rule, e["suppress"].divisor) == ("failure_suppression", 20.0)
  assert "precedence" not in e["suppress"].reason
  assert (e["longlow"].rule, e["longlow"].divisor) == ("long_low_reward", 2.5)
  for f in ("longok", "fewhigh", "invalid"):
    assert (e[f].rule, e[f].divisor, e[f].old_divisor) == ("unchanged", 10.0, 10.0), f
  assert e["invalid"].stats["high_reward_failures"] == 0
  assert (e["tiny"].rule, e["tiny"].divisor, e["tiny"].samples) == ("unchanged", 10.0, 2)
  assert "only 2 trajectories" in e["tiny"].reason
  assert (e["absent"].rule, e["absent"].samples) == ("unchanged", 50) and "no trajectories" in e["absent"].reason
  assert e["fresh"].rule == "new" and e["fresh"].old_divisor is None
  assert e["fresh"].divisor == np.quantile([4, 8, 15, 16, 23, 42], 0.9)
  assert new.rule_counts() == {"failure_suppression": 2, "long_low_reward": 1, "unchanged": 5, "new": 1}
  assert e["suppress"].samples == 8 and e["suppress"].source == "steps 0-8"
  assert new.settings["suppression_factor"] == 2.0


def test_recalibration_thresholds_come_from_config():
  old, table = recalibration_fixture()
  # Halving instead of quartering (the paper's ablation), and a stricter suppression share.
  cfg = dataclasses.replace(RewardConfig(), long_low_reward_factor=0.5, high_reward_failure_share=0.3)
  e = recalibrate_spr_divisors(old, table, cfg).families
  assert (e["both"].rule, e["both"].divisor) == ("long_low_reward", 5.0)  # 25% < 30%: no suppression
  assert (e["longlow"].rule, e["longlow"].divisor) == ("long_low_reward", 5.0)
  assert e["suppress"].rule == "failure_suppression"  # 50% >= 30%
  cfg = dataclasses.replace(RewardConfig(), recalibration_min_samples=1)
  assert recalibrate_spr_divisors(old, table, cfg).families["tiny"].rule == "failure_suppression"


def test_recalibration_reduces_high_reward_failures():
  old, table = recalibration_fixture()
  new = recalibrate_spr_divisors(old, table)
  fail = table.success == 0
  before = score_table(table, "spr", old)
  after = score_table(table, "spr", new)
  assert ((after >= 0.5) & fail).sum() < ((before >= 0.5) & fail).sum()
  longlow = table.family == "longlow"
  assert after[longlow].mean() > before[longlow].mean()


def test_calibrate_cli(tmp_path, capsys):
  old, table = recalibration_fixture()
  traj = tmp_path / "traj.jsonl"
  traj.write_text("".join(json.dumps(r) + "\n" for r in table.rows()))  # what a phase's outcomes.jsonl holds
  assert calibrate_main(["fdr", "--trajectories", str(traj), "--out", str(tmp_path / "fdr.json")]) == 0
  fdr = load_divisor_table(tmp_path / "fdr.json")
  assert fdr.divisor("fresh") == np.quantile([4, 8, 15, 16, 23, 42], 0.9)
  old.save(tmp_path / "old.json")
  assert calibrate_main(["spr", "--table", str(tmp_path / "old.json"), "--trajectories", str(traj),
                        "--out", str(tmp_path / "spr.json"), "reward.long_low_reward_factor=0.5"]) == 0
  spr = load_divisor_table(tmp_path / "spr.json")
  assert spr.divisor("longlow") == 5.0 and spr.settings["long_low_reward_factor"] == 0.5
  assert calibrate_main(["show", f"--table={tmp_path / 'spr.json'}"]) == 0
  out = capsys.readouterr().out
  assert "failure_suppression" in out and "longlow" in out
  assert calibrate_main(["show", f"--table={tmp_path / 'missing.json'}"]) == 2
  assert calibrate_main(["spr", "--table", str(tmp_path / "old.json"), "--trajectories", str(traj),
                         "--out", str(tmp_path / "x.json"), "reward.suppression_factor=0"]) == 2


def test_divisor_table_pickles_to_an_equal_table():
  """A multi-host run hands the first process's table to the others by pickle: same table, same digest."""
  import pickle
  t = calibrate_fdr_divisors([("build", 4), ("build", 8), ("web", 2)], quantile=0.5, fallback_divisor=5.0,
                             phase="rpr1", source="test")
  u = pickle.loads(pickle.dumps(t))
  assert u == t and u.digest == t.digest and u.divisor("build") == t.divisor("build") != t.fallback_divisor
  assert dict(u.families) == dict(t.families)
