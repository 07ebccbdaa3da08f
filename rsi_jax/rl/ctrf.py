"""Verifier reports: CTRF parsing and the terminal gate (paper §2.2, App. B).

A verifier run leaves two things (Harbor / Terminal-Bench layout, ``/logs/verifier/``):

* ``ctrf.json`` -- a Common Test Report Format file with one entry per check. Two dialects occur and both
  parse: the CTRF specification's (camelCase keys such as ``rawStatus`` / ``filePath``, integer ms,
  ``reportFormat: "CTRF"``) and older ``pytest-json-ctrf`` releases' (snake_case keys such as
  ``raw_status`` / ``file_path``, no ``reportFormat``; they also collapse the cases of a parametrized test
  into one entry). Only ``results.tests[*].name`` and ``.status`` are read; timings are ignored.
* ``reward.txt`` -- the terminal gate: the complete protected verifier's number r_terminal, and
  S = 1{r_terminal >= 1}. Without ``reward.txt`` the test command's exit status stands in (S = 1{exit == 0}).

Counting (all counts exclude hygiene checks, i.e. tests whose name matches one of ``hygiene_patterns``,
Python regexes applied with ``re.search`` to the CTRF test name, e.g. ``tests/test_outputs.py::test_x``):

* ``passed`` P  -- entries with status ``passed`` (a flaky pass and an unexpected xpass count as passed);
* ``failed``    -- entries with status ``failed`` (call, setup and teardown failures alike);
* ``skipped``   -- ``skipped`` and ``pending`` entries (pytest reports xfail as skipped);
* ``other``     -- ``other`` or any status outside the CTRF enum;
* ``total`` N   -- every non-hygiene entry, so N = passed + failed + skipped + other. A skipped check still
  counts: N is a property of the task's verifier, not of how far the agent got.

A report is *invalid* (reward falls back to S, Eq. 6-7) when the file is missing, unreadable, not JSON, lacks
``results.tests``, has a malformed entry, or has no non-hygiene test (a pytest collection error writes a
report with 0 tests). ``CTRFReport.reason`` says which.

Three verification states (:class:`VerificationState`) reach training:

* ``ok``              -- valid report and known gate: reward from P, S and the family divisor;
* ``invalid_report``  -- gate known, report unusable: reward = S;
* ``infra_failure``   -- the sandbox or verifier itself failed (container died, verifier timed out, no gate
  result at all). Neither success nor failure: the trajectory is masked out of training and counted.

For the environment side, :func:`verification_outcome` builds a :class:`VerificationOutcome` from what the
verifier produced (CTRF path / dict / JSON text, ``reward.txt`` text, test exit status, or an infrastructure
error message) and :func:`read_verifier_dir` does the same from a copied ``/logs/verifier`` folder::

    out = read_verifier_dir(host_logs / "verifier", exit_code=rc, hygiene_patterns=cfg.reward.hygiene_patterns)
    out.state        # VerificationState.OK / INVALID_REPORT / INFRA_FAILURE
    out.success      # 0 / 1 (None for infra failures)
    out.passed, out.total, out.report_valid, out.trainable, out.reason
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

CTRF_STATUSES = ("passed", "failed", "skipped", "pending", "other")
CTRF_FILENAME = "ctrf.json"
REWARD_FILENAME = "reward.txt"


class VerificationState(str, enum.Enum):
  OK = "ok"
  INVALID_REPORT = "invalid_report"
  INFRA_FAILURE = "infra_failure"


@dataclasses.dataclass(frozen=True)
class CTRFReport:
  """Counts from one CTRF report; all counts exclude hygiene checks (see the module docstring)."""
  valid: bool
  passed: int = 0
  failed: int = 0
  skipped: int = 0
  other: int = 0
  hygiene_passed: int = 0
  hygiene_total: int = 0
  reason: str = ""  # why the report is invalid; "" when valid
  dialect: str = ""  # "camelCase" (CTRF spec), "snake_case" (older pytest-json-ctrf) or "" (cannot tell)
  warnings: tuple = ()  # non-fatal oddities, e.g. the summary disagreeing with the test list
  # every entry of the report, in order: (name, status, is a hygiene check); kept for transcripts
  checks: tuple = ()

  @property
  def total(self) -> int:
    """N: every non-hygiene check (passed + failed + skipped + other)."""
    return self.passed + self.failed + self.skipped + self.other

  @classmethod
  def invalid(cls, reason: str, **kw) -> "CTRFReport":
    return cls(valid=False, reason=reason, **kw)


def compile_hygiene_patterns(patterns: Iterable[str] | str | None) -> tuple[re.Pattern, ...]:
  """Compile hygiene-check name patterns; a bad regex is a configuration error (ValueError)."""
  if patterns is None:
    return ()
  if isinstance(patterns, str):
    patterns = (patterns,)
  out = []
  for p in patterns:
    if isinstance(p, re.Pattern):
      out.append(p)
      continue
    try:
      out.append(re.compile(p))
    except re.error as e:
      raise ValueError(f"hygiene pattern {p!r} is not a valid regex: {e}") from None
  return tuple(out)


def parse_ctrf(source: str | os.PathLike | Mapping | None,
               hygiene_patterns: Iterable[str] | str = ()) -> CTRFReport:
  """Parse a CTRF report into non-hygiene counts.

  Args:
    source: a path (``str`` / ``PathLike``) to a CTRF JSON file, an already-loaded dict, JSON text (a ``str``
      whose first non-blank character is ``{`` or ``[``, or ``bytes``), or None (no report was written).
    hygiene_patterns: regexes; a test whose name matches any of them (``re.search``) is a hygiene check and
      is excluded from every count except ``hygiene_passed`` / ``hygiene_total``.

  Returns:
    A :class:`CTRFReport`. Problems with the report itself never raise: they give ``valid=False`` and a
    ``reason``. Only an invalid hygiene regex raises (ValueError).
  """
  patterns = compile_hygiene_patterns(hygiene_patterns)
  data, err = _load(source)
  if err:
    return CTRFReport.invalid(err)
  return _count(data, patterns)


def _load(source) -> tuple[Any, str]:
  if source is None:
    return None, "no CTRF report (missing file)"
  if isinstance(source, Mapping):
    return source, ""
  if isinstance(source, (bytes, bytearray)):
    return _loads(bytes(source).decode("utf-8", errors="replace"), "CTRF text")
  if isinstance(source, str) and source.lstrip()[:1] in ("{", "["):
    return _loads(source, "CTRF text")
  if not isinstance(source, (str, os.PathLike)):
    return None, f"unsupported CTRF source of type {type(source).__name__}"
  path = Path(source)
  try:
    text = path.read_text(encoding="utf-8", errors="replace")
  except FileNotFoundError:
    return None, f"no CTRF report: {path} does not exist"
  except IsADirectoryError:
    return None, f"CTRF report {path} is a directory"
  except OSError as e:
    return None, f"cannot read CTRF report {path}: {e.strerror or e}"
  return _loads(text, str(path))


def _loads(text: str, what: str) -> tuple[Any, str]:
  if not text.strip():
    return None, f"{what} is empty"
  try:
    return json.loads(text), ""
  except json.JSONDecodeError as e:
    return None, f"{what} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"


def _count(data, patterns) -> CTRFReport:
  if not isinstance(data, Mapping):
    return CTRFReport.invalid(f"CTRF top level must be an object, got {type(data).__name__}")
  fmt = data.get("reportFormat", data.get("report_format"))
  if fmt is not None and str(fmt).upper() != "CTRF":
    return CTRFReport.invalid(f"reportFormat is {fmt!r}, not 'CTRF'")
  results = data.get("results")
  if not isinstance(results, Mapping):
    return CTRFReport.invalid("CTRF report has no 'results' object")
  tests = results.get("tests")
  if not isinstance(tests, list):
    return CTRFReport.invalid("CTRF report has no 'results.tests' list")

  dialect = _dialect(data, tests)
  counts = dict.fromkeys(("passed", "failed", "skipped", "other", "hygiene_passed", "hygiene_total"), 0)
  warnings, checks = [], []
  for i, t in enumerate(tests):
    if not isinstance(t, Mapping):
      return CTRFReport.invalid(f"results.tests[{i}] is not an object", dialect=dialect)
    name, status = t.get("name"), t.get("status")
    if not isinstance(name, str):
      return CTRFReport.invalid(f"results.tests[{i}] has no string 'name'", dialect=dialect)
    if not isinstance(status, str):
      return CTRFReport.invalid(f"results.tests[{i}] ({name}) has no string 'status'", dialect=dialect)
    status = status.lower()
    if status not in CTRF_STATUSES:
      warnings.append(f"{name}: unknown status {status!r} counted as 'other'")
      status = "other"
    hygiene = any(p.search(name) for p in patterns)
    checks.append((name, status, hygiene))
    if hygiene:
      counts["hygiene_total"] += 1
      counts["hygiene_passed"] += status == "passed"
      continue
    key = {"pending": "skipped"}.get(status, status)
    counts[key] += 1

  summary = results.get("summary")
  if isinstance(summary, Mapping) and isinstance(summary.get("tests"), int) and summary["tests"] != len(tests):
    warnings.append(f"summary.tests = {summary['tests']} but results.tests has {len(tests)} entries")

  kw = dict(counts, dialect=dialect, warnings=tuple(warnings), checks=tuple(checks))
  n = counts["passed"] + counts["failed"] + counts["skipped"] + counts["other"]
  if not tests:
    return CTRFReport.invalid("CTRF report has 0 tests (collection error or no tests ran)", **kw)
  if n == 0:
    return CTRFReport.invalid(f"all {len(tests)} tests are hygiene checks; no semantic checks", **kw)
  return CTRFReport(valid=True, **kw)


_CAMEL = ("reportFormat", "specVersion", "rawStatus", "filePath", "reportId", "generatedBy")
_SNAKE = ("raw_status", "file_path", "report_format", "spec_version")


def _dialect(data: Mapping, tests: list) -> str:
  keys = set(data)
  for t in tests[:50]:
    if isinstance(t, Mapping):
      keys |= set(t)
  if keys & set(_CAMEL):
    return "camelCase"
  if keys & set(_SNAKE):
    return "snake_case"
  return ""


# ------------------------------------------------------------------------------------------ terminal gate


@dataclasses.dataclass(frozen=True)
class VerificationOutcome:
  """What the verifier says about one trajectory: state, strict success S and the CTRF counts.

  ``success`` is S in {0, 1} (None for an infrastructure failure). ``report`` is the parsed CTRF report (None
  when none was given, e.g. infra failures). ``passed`` / ``total`` are the report's non-hygiene counts when
  the state is ``ok`` and 0 otherwise, so they can be fed to :func:`rsi_jax.rl.rewards.fdr_reward` directly
  together with ``report_valid``.
  """
  state: VerificationState
  success: int | None
  report: CTRFReport | None = None
  terminal_reward: float | None = None  # the number in reward.txt, if any
  exit_code: int | None = None
  reason: str = ""  # why the state is not ok ("" when ok)

  @property
  def report_valid(self) -> bool:
    return self.state is VerificationState.OK

  @property
  def trainable(self) -> bool:
    """False for infrastructure failures: masked out of training (and counted)."""
    return self.state is not VerificationState.INFRA_FAILURE

  @property
  def passed(self) -> int:
    return self.report.passed if self.report_valid else 0

  @property
  def total(self) -> int:
    return self.report.total if self.report_valid else 0

  def to_dict(self) -> dict:
    return {"state": self.state.value, "success": self.success, "valid": self.report_valid,
            "passed": self.passed, "total": self.total, "terminal_reward": self.terminal_reward,
            "exit_code": self.exit_code, "reason": self.reason}


def terminal_success(reward_text: str | bytes | None = None,
                     exit_code: int | None = None) -> tuple[int | None, float | None, str]:
  """S from the terminal gate: ``reward.txt`` (S = 1{r >= 1}) if it holds a number, else the exit status.

  Returns (S or None when neither source is usable, r_terminal or None, a note on what was used / missing).
  """
  note = ""
  if reward_text is not None:
    if isinstance(reward_text, (bytes, bytearray)):
      reward_text = bytes(reward_text).decode("utf-8", errors="replace")
    s = reward_text.strip()
    try:
      r = float(s)
    except ValueError:
      r = math.nan
    if math.isfinite(r):
      return int(r >= 1.0), r, ""
    note = f"reward.txt does not hold a finite number ({s[:40]!r})"
  if exit_code is not None:
    return int(exit_code == 0), None, note
  return None, None, note or "no reward.txt and no test exit status"


def verification_outcome(ctrf: str | os.PathLike | Mapping | bytes | None = None,
                         reward_text: str | bytes | None = None,
                         exit_code: int | None = None,
                         *,
                         infra_error: str | None = None,
                         hygiene_patterns: Iterable[str] | str = ()) -> VerificationOutcome:
  """Build the outcome of one verification from the verifier's outputs.

  Args:
    ctrf: the CTRF report as a path, dict or JSON text; None if the verifier wrote none.
    reward_text: the contents of ``reward.txt`` (None if absent).
    exit_code: the test command's exit status (None if unknown).
    infra_error: set (non-empty) when the sandbox or verifier failed for reasons outside the agent's control
      (container died, verifier timeout, Docker error). Takes precedence over everything else.
    hygiene_patterns: see :func:`parse_ctrf`.
  """
  if infra_error:
    return VerificationOutcome(VerificationState.INFRA_FAILURE, None, exit_code=exit_code,
                               reason=f"infrastructure failure: {infra_error}")
  success, r, note = terminal_success(reward_text, exit_code)
  if success is None:
    return VerificationOutcome(VerificationState.INFRA_FAILURE, None, exit_code=exit_code,
                               reason=f"terminal gate unavailable: {note}")
  report = parse_ctrf(ctrf, hygiene_patterns)
  if not report.valid:
    return VerificationOutcome(VerificationState.INVALID_REPORT, success, report, r, exit_code,
                               reason=f"invalid report: {report.reason}")
  return VerificationOutcome(VerificationState.OK, success, report, r, exit_code)


def read_verifier_dir(logs_dir: str | os.PathLike, exit_code: int | None = None, *,
                      infra_error: str | None = None,
                      hygiene_patterns: Iterable[str] | str = ()) -> VerificationOutcome:
  """:func:`verification_outcome` from a verifier log folder holding ``ctrf.json`` and ``reward.txt``."""
  d = Path(logs_dir)
  ctrf_path = d / CTRF_FILENAME
  reward_path = d / REWARD_FILENAME
  try:
    reward_text = reward_path.read_text(errors="replace")
  except OSError:
    reward_text = None
  return verification_outcome(ctrf_path, reward_text, exit_code,
                              infra_error=infra_error, hygiene_patterns=hygiene_patterns)
