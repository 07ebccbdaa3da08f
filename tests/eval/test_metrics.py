"""Evaluation metrics against slow, obvious loops over attempts (Eq. 21)."""

import math

import numpy as np
import pytest

from rsi_jax.eval.metrics import (by_stratum, mean_at_r, pass_at_r, process_reward, run_equal_mean,
                                  strict_completions)


def _slow_mean(s):
  total = count = 0
  for row in s:
    for v in row:
      total += 0 if (v is None or (isinstance(v, float) and math.isnan(v))) else v
      count += 1
  return 100 * total / count


def _slow_pass(s):
  solved = 0
  for row in s:
    solved += any(v == 1 for v in row)
  return 100 * solved / len(s)


@pytest.mark.parametrize("seed", range(5))
def test_mean_and_pass_at_r_against_loops(seed):
  rng = np.random.default_rng(seed)
  s = rng.integers(0, 2, size=(7, 3)).astype(float)
  s[rng.random(s.shape) < 0.1] = np.nan  # unscored attempts
  assert mean_at_r(s) == pytest.approx(_slow_mean(s.tolist()))
  assert pass_at_r(s) == pytest.approx(_slow_pass(s.tolist()))
  assert pass_at_r(s) >= mean_at_r(s)


def test_known_values_and_non_reconstructibility():
  # Same Mean@2 (50%), different pass@2: the metrics cannot be reconstructed from one another.
  a = [[1, 1], [0, 0]]
  b = [[1, 0], [0, 1]]
  assert mean_at_r(a) == mean_at_r(b) == 50.0
  assert pass_at_r(a) == 50.0 and pass_at_r(b) == 100.0
  assert mean_at_r([[np.nan, 1]]) == 50.0  # an attempt without a reward is a failure


def test_run_equal_mean_differs_from_pooling():
  runs = [{"a": 1, "b": 0}, {"a": 1, "b": 1, "c": 1, "d": 0}]
  assert run_equal_mean(runs) == pytest.approx((50 + 75) / 2)
  pooled = 100 * 4 / 6
  assert run_equal_mean(runs) != pytest.approx(pooled)


def test_process_reward_and_strict_completions():
  assert process_reward([0.5, 1.0, np.nan, 0.0]) == pytest.approx(0.5)  # unscored excluded
  s = np.array([[1, 1, 0], [0, 1, 0], [1, 1, 1]], float)
  assert strict_completions(s) == pytest.approx((2 + 3 + 1) / 3)


def test_by_stratum():
  s = np.array([[1, 1], [0, 0], [1, 0]], float)
  out = by_stratum(s, ["easy", "hard", "easy"])
  assert out["easy"] == {"tasks": 2, "scored_attempts": 4, "infra_failures": 0, "mean_at_r": 75.0,
                         "pass_at_r": 100.0, "mean_at_r_with_infra_as_failure": 75.0,
                         "pass_at_r_with_infra_as_failure": 100.0}
  assert out["hard"]["mean_at_r"] == 0.0


def test_by_stratum_leaves_infrastructure_failures_out_as_the_headline_does():
  """A group's figures follow the headline (scored attempts only), the infrastructure failures counted beside
  them; a group with nothing scored has no figure (None), not 0."""
  nan = np.nan
  s = np.array([[1, nan], [nan, nan], [0, 1], [nan, nan]], float)
  out = by_stratum(s, ["easy", "hard", "easy", "hard"])
  assert out["easy"]["mean_at_r"] == pytest.approx(100 * 2 / 3) and out["easy"]["pass_at_r"] == 100.0
  assert out["easy"]["infra_failures"] == 1 and out["easy"]["scored_attempts"] == 3
  assert out["easy"]["mean_at_r_with_infra_as_failure"] == 50.0
  assert out["hard"]["mean_at_r"] is None and out["hard"]["pass_at_r"] is None
  assert out["hard"]["infra_failures"] == 4 and out["hard"]["mean_at_r_with_infra_as_failure"] == 0.0


def test_bad_inputs():
  with pytest.raises(ValueError, match="must be 0, 1 or NaN"):
    mean_at_r([[0.5]])
  with pytest.raises(ValueError, match=r"\(tasks, repeats\) matrix"):
    pass_at_r([1, 0])
  with pytest.raises(ValueError, match="no scored attempts"):
    process_reward([np.nan])
  with pytest.raises(ValueError, match="run 1 has no valid tasks"):
    run_equal_mean([{"a": 1}, {}])
  with pytest.raises(ValueError, match="2 strata for 3 tasks"):
    by_stratum(np.zeros((3, 1)), ["a", "b"])
