"""Family divisor tables: calibration (FDR), recalibration (SPR), and their provenance (paper §2.2, App. B).

A :class:`DivisorTable` maps task family -> divisor (D_f for FDR, D'_f for SPR); families it does not list use
``fallback_divisor`` (82 in the paper). A table is immutable and is frozen for a whole phase: the pipeline
loads it once (``reward.divisor_table``) and records :attr:`DivisorTable.digest` with the phase's checkpoints.
Every entry carries its provenance: sample count, source, and after a recalibration the old divisor, the
rule that fired and the reason with the statistics behind it.

* :func:`calibrate_fdr_divisors` -- D_f = q_0.90(N | f), the quantile (numpy's ``np.quantile``, method
  "linear" by default) of total non-hygiene checks N over a family's valid reports.
* :func:`recalibrate_spr_divisors` -- between phases, from a table of trajectories scored with SPR under the
  old divisors, in priority order:

  1. failure suppression: if at least ``high_reward_failure_share`` of a family's failures score
     >= ``high_reward_failure_threshold``, D' is multiplied by ``suppression_factor`` (2: doubled);
  2. long low-reward: otherwise, if the family's median turns >= ``long_low_reward_turns`` and its mean
     reward < ``long_low_reward_mean``, D' is multiplied by ``long_low_reward_factor`` (1/4: quartered);
  3. families absent from the old table with enough valid reports are newly calibrated (quantile of N);
     every other family keeps its divisor.

  Families with fewer than ``recalibration_min_samples`` trajectories are left unchanged. Where rules 1 and 2
  both match, rule 1 wins and the reason says so.

Table file (JSON)::

    {"format": "rsi_jax.divisor_table/1", "kind": "spr", "fallback_divisor": 82.0, "phase": "rpr2",
     "source": "...", "created": "2026-...Z", "parent": "<digest of the table it was derived from>",
     "settings": {...thresholds and quantile...}, "notes": [...],
     "families": {"<family>": {"divisor": 24.0, "samples": 96, "source": "...", "old_divisor": 12.0,
                               "rule": "failure_suppression", "reason": "...", "stats": {...}}}}

Command line: :mod:`rsi_jax.rl.calibrate` (``python -m rsi_jax.rl.calibrate fdr | spr | show``).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from rsi_jax.config import REPO_ROOT, RewardConfig
from rsi_jax.rl.outcome_table import OutcomeTable
from rsi_jax.rl.rewards import REWARD_KINDS, spr_reward

TABLE_FORMAT = "rsi_jax.divisor_table/1"
DEFAULT_FALLBACK_DIVISOR = 82.0
RULES = ("calibrated", "manual", "new", "unchanged", "failure_suppression", "long_low_reward")


@dataclasses.dataclass(frozen=True)
class FamilyDivisor:
  """One family's divisor and where it came from."""
  divisor: float
  samples: int = 0  # reports / trajectories behind the latest decision for this family
  source: str = ""
  old_divisor: float | None = None  # before the latest recalibration (None: first calibration)
  rule: str = "calibrated"  # one of RULES
  reason: str = ""
  stats: Mapping = dataclasses.field(default_factory=dict)  # statistics the decision used

  def __post_init__(self):
    if not (isinstance(self.divisor, (int, float)) and math.isfinite(self.divisor) and self.divisor > 0):
      raise ValueError(f"divisor must be finite and > 0, got {self.divisor!r}")
    if self.old_divisor is not None and not (math.isfinite(self.old_divisor) and self.old_divisor > 0):
      raise ValueError(f"old_divisor must be finite and > 0, got {self.old_divisor!r}")
    if not (isinstance(self.samples, int) and self.samples >= 0):
      raise ValueError(f"samples must be an integer >= 0, got {self.samples!r}")
    if self.rule not in RULES:
      raise ValueError(f"rule must be one of {RULES}, got {self.rule!r}")
    object.__setattr__(self, "divisor", float(self.divisor))
    object.__setattr__(self, "stats", types.MappingProxyType(dict(self.stats)))

  def to_dict(self) -> dict:
    d = {"divisor": self.divisor, "samples": self.samples, "source": self.source,
         "old_divisor": self.old_divisor, "rule": self.rule, "reason": self.reason, "stats": dict(self.stats)}
    return d


@dataclasses.dataclass(frozen=True)
class DivisorTable:
  """Immutable family -> divisor lookup with a fallback and provenance. See the module docstring."""
  families: Mapping[str, FamilyDivisor] = dataclasses.field(default_factory=dict)
  fallback_divisor: float = DEFAULT_FALLBACK_DIVISOR
  kind: str = "fdr"  # the reward it was calibrated for
  phase: str = ""
  source: str = ""
  created: str = ""
  parent: str = ""  # digest of the table this one was recalibrated from
  settings: Mapping = dataclasses.field(default_factory=dict)
  notes: tuple = ()

  def __post_init__(self):
    fb = self.fallback_divisor
    if not (isinstance(fb, (int, float)) and math.isfinite(fb) and fb > 0):
      raise ValueError(f"fallback_divisor must be finite and > 0, got {fb!r}")
    if self.kind not in REWARD_KINDS:
      raise ValueError(f"kind must be one of {REWARD_KINDS}, got {self.kind!r}")
    fams = {}
    for name, e in self.families.items():
      if not isinstance(e, FamilyDivisor):
        raise TypeError(f"family {name!r}: expected FamilyDivisor, got {type(e).__name__}")
      fams[str(name)] = e
    object.__setattr__(self, "fallback_divisor", float(fb))
    object.__setattr__(self, "families", types.MappingProxyType(dict(sorted(fams.items()))))
    object.__setattr__(self, "settings", types.MappingProxyType(dict(self.settings)))
    object.__setattr__(self, "notes", tuple(self.notes))

  def __contains__(self, family) -> bool:
    return family in self.families

  def __len__(self) -> int:
    return len(self.families)

  def __reduce__(self):  # pickled as its canonical dict (multi-host: the table goes to every process)
    return DivisorTable.from_dict, (self.to_dict(),)

  def divisor(self, family: str) -> float:
    e = self.families.get(family)
    return e.divisor if e is not None else self.fallback_divisor

  def lookup(self, families: Sequence[str] | np.ndarray) -> np.ndarray:
    """Divisors for a sequence of family names, float64 (len(families),); unknown -> fallback."""
    fam = np.asarray(families, dtype=str)
    if fam.size == 0:
      return np.zeros(fam.shape, np.float64)
    uniq, inv = np.unique(fam, return_inverse=True)
    return np.array([self.divisor(f) for f in uniq], np.float64)[inv].reshape(fam.shape)

  def to_dict(self) -> dict:
    return {"format": TABLE_FORMAT, "kind": self.kind, "fallback_divisor": self.fallback_divisor,
            "phase": self.phase, "source": self.source, "created": self.created, "parent": self.parent,
            "settings": _plain(self.settings), "notes": list(self.notes),
            "families": {k: _plain(v.to_dict()) for k, v in self.families.items()}}

  @property
  def digest(self) -> str:
    """sha256 (hex, 16 chars) of the canonical JSON of the table: what a phase records as 'frozen'."""
    blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]

  def rule_counts(self) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in self.families.values():
      out[e.rule] = out.get(e.rule, 0) + 1
    return out

  @classmethod
  def from_dict(cls, d: Mapping, where: str = "divisor table") -> "DivisorTable":
    if not isinstance(d, Mapping):
      raise ValueError(f"{where}: top level must be an object")
    fmt = d.get("format")
    if fmt != TABLE_FORMAT:
      raise ValueError(f"{where}: format must be {TABLE_FORMAT!r}, got {fmt!r}")
    known = {"format", "kind", "fallback_divisor", "phase", "source", "created", "parent", "settings",
             "notes", "families"}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {sorted(known)})")
    fams = {}
    for name, e in (d.get("families") or {}).items():
      if not isinstance(e, Mapping):
        raise ValueError(f"{where}: family {name!r}: expected an object")
      try:
        fams[name] = FamilyDivisor(**e)
      except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: family {name!r}: {err}") from None
    try:
      return cls(families=fams, fallback_divisor=d.get("fallback_divisor", DEFAULT_FALLBACK_DIVISOR),
                 kind=d.get("kind", "fdr"), phase=d.get("phase", ""), source=d.get("source", ""),
                 created=d.get("created", ""), parent=d.get("parent", ""), settings=d.get("settings") or {},
                 notes=tuple(d.get("notes") or ()))
    except (TypeError, ValueError) as err:
      raise ValueError(f"{where}: {err}") from None

  def save(self, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
    return path


def load_divisor_table(path: str | os.PathLike) -> DivisorTable:
  """Load a table file; a relative path that does not exist here is tried against the repository root."""
  p = resolve_table_path(path)
  try:
    data = json.loads(p.read_text())
  except OSError as e:
    raise ValueError(f"cannot read divisor table {p}: {e.strerror or e}") from None
  except json.JSONDecodeError as e:
    raise ValueError(f"divisor table {p} is not valid JSON: {e}") from None
  return DivisorTable.from_dict(data, str(p))


def resolve_table_path(path: str | os.PathLike) -> Path:
  p = Path(path)
  if not p.is_absolute() and not p.exists() and (REPO_ROOT / p).exists():
    return REPO_ROOT / p
  return p


def divisor_table_from_config(cfg: RewardConfig) -> DivisorTable:
  """The phase's frozen table: ``cfg.divisor_table`` if set (its own fallback applies), else fallback only."""
  if cfg.divisor_table:
    return load_divisor_table(cfg.divisor_table)
  return DivisorTable(fallback_divisor=cfg.fallback_divisor, kind=cfg.kind,
                      source="no divisor table configured: every family uses the fallback divisor")


# ------------------------------------------------------------------------------------------- calibration


def calibrate_fdr_divisors(history: OutcomeTable | Iterable[tuple[str, object]], *,
                           quantile: float = 0.90, fallback_divisor: float = DEFAULT_FALLBACK_DIVISOR,
                           min_samples: int = 1, method: str = "linear", source: str = "",
                           phase: str = "") -> DivisorTable:
  """FDR divisors D_f = q(N | f) from a history of verification reports (Eq. 6).

  Args:
    history: an :class:`OutcomeTable` (its valid rows' ``family`` / ``total``), or ``(family, N)`` pairs
      where N is an int or a :class:`rsi_jax.rl.ctrf.CTRFReport` (invalid reports are skipped).
    quantile: q in (0, 1]; 0.90 in the paper.
    min_samples: families with fewer valid reports are left out (they use the fallback).
    method: passed to ``np.quantile`` ("linear" is numpy's default).
  """
  if not 0 < quantile <= 1:
    raise ValueError(f"quantile must be in (0, 1], got {quantile}")
  if min_samples < 1:
    raise ValueError(f"min_samples must be >= 1, got {min_samples}")
  by_family = _totals_by_family(history)
  fams, notes = {}, []
  for fam, ns in sorted(by_family.items()):
    if len(ns) < min_samples:
      notes.append(f"{fam}: {len(ns)} valid reports < min_samples {min_samples}; uses the fallback")
      continue
    fams[fam] = _calibrated_entry(ns, quantile, method, source, rule="calibrated")
  n_reports = sum(len(v) for v in by_family.values())
  return DivisorTable(
      families=fams, fallback_divisor=fallback_divisor, kind="fdr", phase=phase,
      source=source or f"calibrated from {n_reports} valid reports over {len(by_family)} families",
      created=_now(), settings={"quantile": quantile, "method": method, "min_samples": min_samples},
      notes=tuple(notes))


def _totals_by_family(history) -> dict[str, list[int]]:
  out: dict[str, list[int]] = {}
  if isinstance(history, OutcomeTable):
    for f, n, v in zip(history.family, history.total, history.valid):
      if v:
        out.setdefault(str(f), []).append(int(n))
    return out
  for i, item in enumerate(history):
    fam, n = item
    if hasattr(n, "valid"):  # a CTRFReport
      if not n.valid:
        continue
      n = n.total
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
      raise ValueError(f"history[{i}] ({fam!r}): total must be an integer >= 1, got {n!r}")
    out.setdefault(str(fam), []).append(int(n))
  return out


def _calibrated_entry(ns, quantile, method, source, rule, old=None) -> FamilyDivisor:
  a = np.asarray(ns, np.float64)
  d = float(np.quantile(a, quantile, method=method))
  return FamilyDivisor(
      divisor=d, samples=len(ns), source=source, old_divisor=old, rule=rule,
      reason=f"q{quantile:g} of N over {len(ns)} valid reports",
      stats={"n_min": float(a.min()), "n_median": float(np.median(a)), "n_max": float(a.max())})


# ----------------------------------------------------------------------------------------- recalibration


def recalibrate_spr_divisors(old: DivisorTable, trajectories: OutcomeTable,
                             config: RewardConfig | None = None, *, source: str = "",
                             phase: str = "") -> DivisorTable:
  """SPR divisors D'_f for the next phase (rules and precedence in the module docstring).

  Args:
    old: the divisors the trajectories' phase used (an FDR table seeds the first SPR table).
    trajectories: outcome table with ``turns``; rewards are SPR under ``old``.
    config: thresholds and factors (``RewardConfig`` fields); defaults if None.
  Returns:
    A new table (kind "spr", ``parent`` = ``old.digest``) in which every family records its old divisor, the
    rule that fired and why.
  """
  cfg = config or RewardConfig()
  reward = spr_reward(trajectories.passed.astype(np.float64), trajectories.success,
                      old.lookup(trajectories.family), trajectories.valid)
  names = set(old.families) | {str(f) for f in trajectories.family}
  fams, notes = {}, []
  for fam in sorted(names):
    rows = trajectories.family == fam
    n = int(rows.sum())
    prev = old.families.get(fam)
    if prev is None:
      ns = trajectories.total[rows & trajectories.valid]
      if len(ns) >= cfg.recalibration_min_samples:
        e = _calibrated_entry(ns, cfg.calibration_quantile, "linear", source or "recalibration data",
                              rule="new", old=None)
        fams[fam] = dataclasses.replace(
            e, reason=f"new family (was the fallback {old.fallback_divisor:g}): {e.reason}")
      else:
        notes.append(f"{fam}: not in the old table and {len(ns)} valid reports "
                     f"< {cfg.recalibration_min_samples}; uses the fallback")
      continue
    if n < cfg.recalibration_min_samples:
      why = "no trajectories" if n == 0 else f"only {n} trajectories (< {cfg.recalibration_min_samples})"
      fams[fam] = dataclasses.replace(prev, old_divisor=prev.divisor, rule="unchanged",
                                      reason=f"{why} in the recalibration data; divisor carried over",
                                      stats={}, samples=prev.samples if n == 0 else n)
      continue
    fams[fam] = _recalibrated_entry(prev.divisor, reward[rows], trajectories.success[rows],
                                    trajectories.turns[rows], cfg, source)
  settings = {k: getattr(cfg, k) for k in (
      "high_reward_failure_threshold", "high_reward_failure_share", "long_low_reward_turns",
      "long_low_reward_mean", "suppression_factor", "long_low_reward_factor", "recalibration_min_samples",
      "calibration_quantile")}
  return DivisorTable(
      families=fams, fallback_divisor=old.fallback_divisor, kind="spr", phase=phase,
      source=source or f"recalibrated from table {old.digest} on {len(trajectories)} trajectories",
      created=_now(), parent=old.digest, settings=settings, notes=tuple(notes))


def _recalibrated_entry(d_old, r, s, turns, cfg: RewardConfig, source) -> FamilyDivisor:
  n = len(r)
  fail = s == 0
  n_fail = int(fail.sum())
  n_hrf = int((fail & (r >= cfg.high_reward_failure_threshold)).sum())
  share = n_hrf / n_fail if n_fail else 0.0
  mean_r = float(r.mean())
  known = turns[~np.isnan(turns)]
  median_turns = float(np.median(known)) if len(known) else math.nan
  suppress = n_hrf > 0 and share >= cfg.high_reward_failure_share
  long_low = (not math.isnan(median_turns) and median_turns >= cfg.long_low_reward_turns
              and mean_r < cfg.long_low_reward_mean)
  stats = {"trajectories": n, "failures": n_fail, "high_reward_failures": n_hrf,
           "high_reward_failure_share": share, "mean_reward": mean_r,
           "median_turns": None if math.isnan(median_turns) else median_turns}
  why_s = (f"{n_hrf}/{n_fail} failures ({share:.1%}) score >= {cfg.high_reward_failure_threshold:g} "
           f"(share threshold {cfg.high_reward_failure_share:.1%})")
  turns_txt = "unknown" if math.isnan(median_turns) else f"{median_turns:g}"
  why_l = (f"median turns {turns_txt} (long at >= {cfg.long_low_reward_turns}), mean reward {mean_r:.3f} "
           f"(low below {cfg.long_low_reward_mean:g})")
  if suppress:
    d, rule = d_old * cfg.suppression_factor, "failure_suppression"
    reason = f"failure suppression, divisor x{cfg.suppression_factor:g}: {why_s}"
    if long_low:
      reason += f"; the long low-reward rule also matched ({why_l}) but failure suppression takes precedence"
  elif long_low:
    d, rule = d_old * cfg.long_low_reward_factor, "long_low_reward"
    reason = f"long low-reward family, divisor x{cfg.long_low_reward_factor:g}: {why_l}"
  else:
    d, rule = d_old, "unchanged"
    reason = f"no rule matched: {why_s}; {why_l}"
  return FamilyDivisor(divisor=d, samples=n, source=source or "recalibration data", old_divisor=d_old,
                       rule=rule, reason=reason, stats=stats)


# ----------------------------------------------------------------------------------------------- helpers


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _plain(x):
  if isinstance(x, Mapping):
    return {str(k): _plain(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_plain(v) for v in x]
  if isinstance(x, np.generic):
    return x.item()
  return x


def format_table(t: DivisorTable) -> str:
  lines = [f"divisor table {t.digest}  kind={t.kind}  phase={t.phase or '-'}  fallback={t.fallback_divisor:g}",
           f"  source: {t.source}", f"  created: {t.created or '-'}  parent: {t.parent or '-'}",
           f"  {len(t)} families" + "".join(f", {v} {k}" for k, v in sorted(t.rule_counts().items()))]
  w = max([len(k) for k in t.families] + [6])
  lines.append(f"  {'family':<{w}}  {'divisor':>9}  {'old':>9}  {'samples':>7}  rule")
  for k, e in t.families.items():
    old = "-" if e.old_divisor is None else f"{e.old_divisor:g}"
    lines.append(f"  {k:<{w}}  {e.divisor:>9g}  {old:>9}  {e.samples:>7}  {e.rule}: {e.reason}")
  lines += [f"  note: {n}" for n in t.notes]
  return "\n".join(lines)
