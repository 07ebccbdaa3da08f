"""Family Dense Reward and Success-Prioritized Reward (paper §2.2, Eq. 6-7, App. B).

Per trajectory: P >= 0 passed non-hygiene checks, S in {0, 1} strict terminal success, report validity, and
the family divisor (D_f for FDR, D'_f for SPR; see :mod:`rsi_jax.rl.divisors`)::

    FDR (Eq. 6):  R = max(P / D_f, 0)          if the report is valid, else S
    SPR (Eq. 7):  R = S + P / (P + D'_f)        if the report is valid, else S

Both functions are elementwise over broadcastable arrays and run on numpy inputs (numpy out, float64) or on
JAX inputs (jnp out, default float dtype, jittable). Outside ``jit`` the inputs are validated: counts finite
and >= 0, divisors finite and > 0, S and validity in {0, 1}; a violation raises ValueError. Under ``jit``
nothing can be checked and the formulas are applied as they are.

SPR keeps its ordering exactly in floating point: every failure < 1 <= every success and 0 <= R < 2 for
valid reports. The progress term P / (P + D') is < 1 in exact arithmetic but can round to 1 (and 1 + term to
2) when P / D' is huge, so the result is capped at the largest float below S + 1; this changes nothing
except where rounding would break the bound.

The CTRF / terminal-gate side lives in :mod:`rsi_jax.rl.ctrf` and is re-exported here (``parse_ctrf``,
``CTRFReport``, ``VerificationOutcome``, ``VerificationState``, ``verification_outcome``,
``read_verifier_dir``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from rsi_jax.rl.ctrf import (CTRFReport, VerificationOutcome, VerificationState, parse_ctrf,
                             read_verifier_dir, terminal_success, verification_outcome)

REWARD_KINDS = ("fdr", "spr")

__all__ = ["REWARD_KINDS", "fdr_reward", "spr_reward", "reward_fn", "score_table", "outcome_rewards",
           # re-exported from rsi_jax.rl.ctrf
           "parse_ctrf", "CTRFReport", "VerificationOutcome", "VerificationState", "verification_outcome",
           "read_verifier_dir", "terminal_success"]


def fdr_reward(passed, success, divisor, report_valid):
  """Family Dense Reward, Eq. 6: ``max(P / D_f, 0)`` where the report is valid, else ``S``.

  Args (broadcastable, numpy or JAX):
    passed: P, passed non-hygiene checks (>= 0).
    success: S, strict terminal success (0 / 1).
    divisor: D_f > 0, the family divisor (0.90-quantile of N in the family's history; 82 as fallback).
    report_valid: whether the CTRF report is valid (bool or 0 / 1).
  Returns:
    R_FDR, same broadcast shape. No upper clip and no completion bonus.
  """
  xp, p, s, d, v = _prepare(passed, success, divisor, report_valid)
  return xp.where(v, xp.maximum(p / d, 0.0), s)


def spr_reward(passed, success, divisor, report_valid):
  """Success-Prioritized Reward, Eq. 7: ``S + P / (P + D'_f)`` where the report is valid, else ``S``.

  Arguments as :func:`fdr_reward`, with the SPR divisor D'_f > 0. For valid reports every failure scores in
  [0, 1) and every success in [1, 2); matched (P, family, validity) gives a success exactly one more unit.
  """
  xp, p, s, d, v = _prepare(passed, success, divisor, report_valid)
  progress = p / (p + d)
  # Keep R < S + 1 after rounding (see the module docstring); a no-op for realistic counts.
  valid_r = xp.minimum(s + progress, xp.nextafter(s + 1.0, xp.zeros_like(s)))
  return xp.where(v, valid_r, s)


def reward_fn(kind: str):
  """The reward function for ``reward.kind`` ("fdr" or "spr")."""
  if kind == "fdr":
    return fdr_reward
  if kind == "spr":
    return spr_reward
  raise ValueError(f"unknown reward kind {kind!r} (known: {REWARD_KINDS})")


def score_table(table, kind: str, divisors) -> np.ndarray:
  """Rewards (float64, one per row) of an outcome table under one reward configuration.

  Args:
    table: anything with per-row ``family`` (strings), ``passed``, ``success`` and ``valid`` arrays, e.g.
      :class:`rsi_jax.rl.outcome_table.OutcomeTable`.
    kind: "fdr" or "spr".
    divisors: a :class:`rsi_jax.rl.divisors.DivisorTable` (``.lookup(families)``), or a per-row array.
  """
  d = divisors.lookup(table.family) if hasattr(divisors, "lookup") else np.asarray(divisors, np.float64)
  return np.asarray(reward_fn(kind)(np.asarray(table.passed, np.float64), np.asarray(table.success),
                                    d, np.asarray(table.valid)), np.float64)


def outcome_rewards(outcomes: Sequence[VerificationOutcome], families: Sequence[str], kind: str,
                    divisors) -> tuple[np.ndarray, np.ndarray]:
  """Rewards for a batch of verification outcomes, and the training mask.

  Returns ``(rewards, mask)``, both float32 of shape (len(outcomes),). Infrastructure failures get reward 0
  and mask 0 (neither success nor failure: left out of training); every other row has mask 1.
  """
  if len(outcomes) != len(families):
    raise ValueError(f"{len(outcomes)} outcomes but {len(families)} families")
  mask = np.array([o.trainable for o in outcomes], bool)
  passed = np.array([o.passed for o in outcomes], np.float64)
  success = np.array([o.success if o.trainable else 0 for o in outcomes], np.float64)
  valid = np.array([o.report_valid for o in outcomes], bool)
  d = divisors.lookup(families) if hasattr(divisors, "lookup") else np.asarray(divisors, np.float64)
  r = reward_fn(kind)(passed, success, d, valid) if len(outcomes) else np.zeros(0)
  return np.where(mask, r, 0.0).astype(np.float32), mask.astype(np.float32)


# ----------------------------------------------------------------------------------------------- internals


def _is_jax(x) -> bool:
  # Without jax imported no argument can be a JAX array; this keeps the numpy path (and the rescoring CLI)
  # free of the JAX import.
  jax = sys.modules.get("jax")
  return jax is not None and isinstance(x, jax.Array)


def _is_tracer(x) -> bool:
  jax = sys.modules.get("jax")
  return jax is not None and isinstance(x, jax.core.Tracer)


def _prepare(passed, success, divisor, report_valid):
  args = (passed, success, divisor, report_valid)
  if any(_is_jax(a) for a in args):
    import jax.numpy as xp
    dtype = xp.result_type(float)
  else:
    xp, dtype = np, np.float64
  _validate(passed, success, divisor, report_valid)
  p = xp.asarray(passed, dtype=dtype)
  s = xp.asarray(success, dtype=dtype)
  d = xp.asarray(divisor, dtype=dtype)
  v = xp.asarray(report_valid) != 0
  return xp, p, s, d, v


def _validate(passed, success, divisor, report_valid):
  """Value checks on concrete inputs; traced (jit) inputs are skipped."""

  def concrete(x, name):
    if _is_tracer(x):
      return None
    a = np.asarray(x)
    if a.dtype == object or not (np.issubdtype(a.dtype, np.number) or a.dtype == bool):
      raise ValueError(f"{name} must be numeric, got dtype {a.dtype}")
    return a.astype(np.float64)

  def first_bad(a, bad):
    idx = np.argwhere(bad)[0]
    return f"{a[tuple(idx)]!r} at index {tuple(int(i) for i in idx)}" if a.ndim else repr(a.item())

  p = concrete(passed, "passed")
  if p is not None and (bad := ~(np.isfinite(p) & (p >= 0))).any():
    raise ValueError(f"passed counts must be finite and >= 0; {int(bad.sum())} are not, e.g. {first_bad(p, bad)}")
  d = concrete(divisor, "divisor")
  if d is not None and (bad := ~(np.isfinite(d) & (d > 0))).any():
    raise ValueError(f"divisors must be finite and > 0; {int(bad.sum())} are not, e.g. {first_bad(d, bad)}")
  s = concrete(success, "success")
  if s is not None and (bad := ~((s == 0) | (s == 1))).any():
    raise ValueError(f"success must be 0 or 1; {int(bad.sum())} are not, e.g. {first_bad(s, bad)}")
  v = concrete(report_valid, "report_valid")
  if v is not None and (bad := ~((v == 0) | (v == 1))).any():
    raise ValueError(f"report_valid must be 0/1 or bool; {int(bad.sum())} are not, e.g. {first_bad(v, bad)}")
