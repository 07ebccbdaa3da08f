"""Evaluation metrics (paper §4 and App. E, Eq. 21).

Scores are a task × repeat matrix ``s`` of shape (n, R) with entries in {0, 1} (strict success) or NaN where
an attempt produced no score (an infrastructure failure). Following the paper, an existing attempt without a
reward counts as a failure in Mean@R and pass@R; checker-level means instead *exclude* unscored attempts. An
evaluation's headline, and its figures per difficulty, family and stratum, leave them out instead
(``scored_*``), with the infrastructure failures counted beside them and the paper's figures next to them.

    Mean@R  = 100 / (n R) Σ_i Σ_r s_ir                       (Eq. 21, left)
    pass@R  = 100 / n     Σ_i 1{max_r s_ir = 1}              (Eq. 21, right)
    run-equal mean = R⁻¹ Σ_r (100 / n_r) Σ_{i∈I_r} s_ir      (runs with different valid task sets)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def _scores(s) -> np.ndarray:
  s = np.asarray(s, dtype=np.float64)
  if s.ndim != 2:
    raise ValueError(f"scores must be a (tasks, repeats) matrix, got shape {s.shape}")
  if s.size == 0:
    raise ValueError("scores are empty")
  ok = np.isnan(s) | (s == 0) | (s == 1)
  if not ok.all():
    raise ValueError(f"strict scores must be 0, 1 or NaN (unscored), got {s[~ok][:5].tolist()}")
  return s


def mean_at_r(s) -> float:
  """Mean@R in percent: the mean of all binary attempts; unscored attempts count as failures."""
  s = _scores(s)
  return float(100.0 * np.nan_to_num(s, nan=0.0).mean())


def pass_at_r(s) -> float:
  """pass@R in percent: the share of tasks solved in at least one of their R attempts."""
  s = _scores(s)
  return float(100.0 * (np.nan_to_num(s, nan=0.0).max(axis=1) == 1).mean())


def run_equal_mean(run_scores: Sequence[Mapping[str, float]]) -> float:
  """Mean over runs of each run's success percentage over its own valid task set I_r (App. E)."""
  if not run_scores:
    raise ValueError("no runs")
  per_run = []
  for r, run in enumerate(run_scores):
    if not run:
      raise ValueError(f"run {r} has no valid tasks")
    per_run.append(100.0 * np.mean([float(v) for v in run.values()]))
  return float(np.mean(per_run))


def process_reward(fractions) -> float:
  """Mean checker completion (passed / total per attempt) over scored attempts; NaN attempts excluded."""
  f = np.asarray(fractions, dtype=np.float64)
  f = f[~np.isnan(f)]
  if f.size == 0:
    raise ValueError("no scored attempts")
  if ((f < 0) | (f > 1)).any():
    raise ValueError("checker completion must lie in [0, 1]")
  return float(f.mean())


def strict_completions(s, threshold: float = 1.0) -> float:
  """Mean over repeats of the number of tasks whose terminal score reaches ``threshold`` (strict: 1.00)."""
  s = np.asarray(s, dtype=np.float64)
  if s.ndim != 2:
    raise ValueError(f"scores must be a (tasks, repeats) matrix, got shape {s.shape}")
  return float((np.nan_to_num(s, nan=0.0) >= threshold).sum(axis=0).mean())


def scored_mean_at_r(s) -> float | None:
  """Mean@R over the scored attempts only: infrastructure failures (NaN) are left out, as in the headline of an
  evaluation; None when no attempt was scored."""
  s = _scores(s)
  return float(100.0 * np.nanmean(s)) if (~np.isnan(s)).any() else None


def scored_pass_at_r(s) -> float | None:
  """pass@R over the tasks with at least one scored attempt (the headline's rule); None when there are none."""
  s = _scores(s)
  rows = (~np.isnan(s)).any(axis=1)
  return float(100.0 * (np.nan_to_num(s[rows], nan=0.0).max(axis=1) == 1).mean()) if rows.any() else None


def by_stratum(s, strata: Sequence[str]) -> dict[str, dict]:
  """Per group of tasks (a difficulty, a family), tasks weighted equally within it: the task count, scored
  attempts and infrastructure failures, Mean@R and pass@R as the headline counts them (infrastructure failures
  left out; None for a group with no scored attempt), and both with infrastructure failures as failures."""
  s = _scores(s) if np.size(s) else np.asarray(s, dtype=np.float64)
  if len(strata) != s.shape[0]:
    raise ValueError(f"{len(strata)} strata for {s.shape[0]} tasks")
  out = {}
  for name in sorted(set(strata)):
    rows = np.array([x == name for x in strata])
    g = s[rows]
    out[name] = {"tasks": int(rows.sum()), "scored_attempts": int((~np.isnan(g)).sum()),
                 "infra_failures": int(np.isnan(g).sum()), "mean_at_r": scored_mean_at_r(g),
                 "pass_at_r": scored_pass_at_r(g), "mean_at_r_with_infra_as_failure": mean_at_r(g),
                 "pass_at_r_with_infra_as_failure": pass_at_r(g)}
  return out
