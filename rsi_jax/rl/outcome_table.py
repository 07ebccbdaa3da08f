"""A trajectory outcome table: one row per trajectory's verification outcome, for calibration and rescoring.

Columns (JSONL objects or CSV with a header row; other columns are ignored):

* ``family``  -- task family (string);
* ``success`` -- S, strict terminal success (0/1 or true/false);
* ``valid``   -- whether the CTRF report was valid (0/1 or true/false);
* ``passed``  -- P, passed non-hygiene checks (integer >= 0), needed only when valid (reward = S otherwise);
* ``total``   -- N, all non-hygiene checks (integer, N >= 1 and P <= N), needed only when valid;
* ``turns``   -- interaction turns (number >= 0), optional, needed by SPR recalibration;
* ``state``   -- optional ``ok`` / ``invalid_report`` / ``infra_failure``. Infrastructure-failure rows are
  dropped on reading and counted in ``OutcomeTable.infra_failures`` (neither success nor failure).

Reading never guesses: a missing column, an unparseable value or an impossible count raises ValueError
naming the file, line and column.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np



@dataclasses.dataclass(frozen=True)
class OutcomeTable:
  """Column arrays of equal length n. Infrastructure failures are not rows (see ``infra_failures``)."""
  family: np.ndarray  # (n,) str
  passed: np.ndarray  # (n,) int64
  total: np.ndarray  # (n,) int64
  success: np.ndarray  # (n,) int64 in {0, 1}
  valid: np.ndarray  # (n,) bool
  turns: np.ndarray  # (n,) float64, NaN where unknown
  infra_failures: int = 0  # rows dropped as infrastructure failures

  def __post_init__(self):
    n = len(self.family)
    for f in ("passed", "total", "success", "valid", "turns"):
      if len(getattr(self, f)) != n:
        raise ValueError(f"column {f} has {len(getattr(self, f))} rows, family has {n}")

  def __len__(self):
    return len(self.family)

  @classmethod
  def from_rows(cls, rows: Iterable[Mapping], where: str = "rows") -> "OutcomeTable":
    cols = {k: [] for k in ("family", "passed", "total", "success", "valid", "turns")}
    infra = 0
    for i, row in enumerate(rows):
      loc = f"{where}: row {i + 1}"
      state = row.get("state")
      if state not in (None, ""):
        state = str(state).strip().lower()
        if state not in ("ok", "invalid_report", "infra_failure"):
          raise ValueError(f"{loc}: state must be ok / invalid_report / infra_failure, got {state!r}")
        if state == "infra_failure":
          infra += 1
          continue
      for k in ("family", "success", "valid"):
        if _missing(row, k):
          raise ValueError(f"{loc}: missing column {k!r}")
      family = str(row["family"])
      valid = _bool(row["valid"], f"{loc}: valid")
      if state == "invalid_report" and valid:
        raise ValueError(f"{loc}: state invalid_report but valid is true")
      success = int(_bool(row["success"], f"{loc}: success"))
      passed = total = 0
      if valid:  # counts of an invalid report are not used (reward = S) and may be absent
        for k in ("passed", "total"):
          if _missing(row, k):
            raise ValueError(f"{loc}: missing column {k!r} (required when valid)")
        passed = _count(row["passed"], f"{loc}: passed")
        total = _count(row["total"], f"{loc}: total")
      if valid and passed > total:
        raise ValueError(f"{loc}: passed ({passed}) > total ({total}) in a valid report")
      if valid and total == 0:
        raise ValueError(f"{loc}: a valid report has total > 0 (0-test reports are invalid)")
      turns = row.get("turns")
      if turns is None or turns == "":
        turns = math.nan
      else:
        turns = _number(turns, f"{loc}: turns")
        if turns < 0:
          raise ValueError(f"{loc}: turns must be >= 0, got {turns}")
      for k, v in (("family", family), ("passed", passed), ("total", total),
                   ("success", success), ("valid", valid), ("turns", turns)):
        cols[k].append(v)
    return cls(family=np.array(cols["family"], dtype=str), passed=np.array(cols["passed"], np.int64),
               total=np.array(cols["total"], np.int64), success=np.array(cols["success"], np.int64),
               valid=np.array(cols["valid"], bool), turns=np.array(cols["turns"], np.float64),
               infra_failures=infra)

  def rows(self) -> list[dict]:
    return [{"family": str(self.family[i]), "passed": int(self.passed[i]), "total": int(self.total[i]),
             "success": int(self.success[i]), "valid": bool(self.valid[i]),
             "turns": None if math.isnan(self.turns[i]) else float(self.turns[i])} for i in range(len(self))]


EPISODE_TIMES = ("start_s", "agent_s", "verify_s", "total_s")  # EpisodeResult's timings, in outcome rows


def outcome_row(step: int, episode, reward: float | None = None) -> dict:
  """One row of a phase's ``outcomes.jsonl`` (what :meth:`OutcomeTable.from_rows` reads) for an
  :class:`~rsi_jax.env.episode.EpisodeResult`: its verification state, S, P and N, turns, the reward it was
  trained with (RSR discovery trains on no reward: the row has none) and where its wall time went (seconds:
  container start, agent, verifier, the whole episode), to find the tasks that slow a rollout step down."""
  o = episode.outcome
  row = {"step": int(step), "task": episode.task, "family": episode.family, "state": o.state.value,
         "success": int(o.success or 0), "valid": bool(o.report_valid), "passed": int(o.passed or 0),
         "total": int(o.total or 0), "turns": len(episode.turns),
         **{k: round(float(getattr(episode, k)), 3) for k in EPISODE_TIMES}}
  if reward is not None:
    row["reward"] = float(reward)
  return row


def read_outcome_table(path: str | os.PathLike) -> OutcomeTable:
  """Read a trajectory table from ``.jsonl`` / ``.json`` (JSON lines or one JSON list) or ``.csv``."""
  path = Path(path)
  try:
    text = path.read_text()
  except OSError as e:
    raise ValueError(f"cannot read trajectory table {path}: {e.strerror or e}") from None
  if path.suffix.lower() == ".csv":
    rows = list(csv.DictReader(io.StringIO(text)))
    return OutcomeTable.from_rows(rows, str(path))
  stripped = text.lstrip()
  if stripped.startswith("["):
    try:
      rows = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: not valid JSON: {e}") from None
    return OutcomeTable.from_rows(rows, str(path))
  rows = []
  for lineno, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: line {lineno}: not valid JSON: {e.msg}") from None
    if not isinstance(row, dict):
      raise ValueError(f"{path}: line {lineno}: expected a JSON object")
    rows.append(row)
  return OutcomeTable.from_rows(rows, str(path))


def _missing(row, k) -> bool:
  return k not in row or row[k] is None or row[k] == ""


def _bool(v, where) -> bool:
  if isinstance(v, bool):
    return v
  if isinstance(v, (int, float)) and v in (0, 1):
    return bool(v)
  if isinstance(v, str):
    s = v.strip().lower()
    if s in ("1", "true", "yes", "t", "y", "1.0"):
      return True
    if s in ("0", "false", "no", "f", "n", "0.0"):
      return False
  raise ValueError(f"{where}: expected 0/1 or true/false, got {v!r}")


def _number(v, where) -> float:
  if isinstance(v, bool):
    raise ValueError(f"{where}: expected a number, got {v!r}")
  try:
    x = float(v)
  except (TypeError, ValueError):
    raise ValueError(f"{where}: expected a number, got {v!r}") from None
  if not math.isfinite(x):
    raise ValueError(f"{where}: expected a finite number, got {v!r}")
  return x


def _count(v, where) -> int:
  x = _number(v, where)
  if x < 0 or not x.is_integer():
    raise ValueError(f"{where}: expected an integer count >= 0, got {v!r}")
  return int(x)
