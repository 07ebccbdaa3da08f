"""Frozen structural difficulty strata (paper Fig. 10, App. F).

Per task, three structural proxies, defined before any model outcome is seen:

* **checker scale** — the larger of the extracted checker count (the number of checks a reference run of the
  verifier reported, when one is known) and the number of distinct static test functions (``def test_*`` in
  the task's test files);
* **file footprint** — files of the task's data and environment (build context), tests and reference
  artifacts (the solution), not files an agent would repair;
* **instruction length** — characters.

A task's score is the mean of its empirical percentile ranks on the three proxies (the mid-rank definition:
(#values below + #values at or below) / 2n, so tied tasks share a rank). The quartile cut-offs of the scores
define Easy, Medium, Hard and Extreme; a score equal to a cut-off goes to the lower stratum. Missing fields
count as zero. The assignment is written once into a file stored with the suite (``strata.json`` in the tasks
folder) and read back from then on, so it stays fixed across checkpoints.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

STRATA = ("Easy", "Medium", "Hard", "Extreme")
PROXIES = ("checker_scale", "file_footprint", "instruction_length")
STRATA_FILE = "strata.json"


def static_test_functions(task) -> int:
  """Distinct static test functions (``test_*`` functions, methods included) in the task's Python tests."""
  names = set()
  tests = Path(task.tests_dir)
  files = sorted(tests.rglob("*.py")) if tests.is_dir() else []
  for f in files:
    try:
      tree = ast.parse(f.read_text(errors="replace"))
    except SyntaxError:
      continue
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
        names.add(f"{f.relative_to(tests)}::{node.name}")
  return len(names)


def file_footprint(task) -> int:
  """Files of the build context (data and environment), the tests and the reference solution."""
  def count(d: Path) -> int:
    return sum(1 for p in d.rglob("*") if p.is_file()) if d.is_dir() else 0
  ctx = Path(task.context_dir)
  n = sum(1 for p in ctx.rglob("*") if p.is_file() and p.relative_to(ctx).parts[0] not in set(task.context_exclude))
  n += count(Path(task.tests_dir)) + len(task.extra_test_files)
  if task.solution is not None:
    sol = Path(task.solution)
    n += count(sol.parent) if sol.name == "solve.sh" else 1
  return n


def proxies(task, checker_count: int | None = None) -> dict[str, float]:
  """The three proxies of ``task``; ``checker_count``: checks a reference verifier run reported (None:
  unknown, counts as zero)."""
  return {"checker_scale": float(max(checker_count or 0, static_test_functions(task))),
          "file_footprint": float(file_footprint(task)),
          "instruction_length": float(len(task.instruction or ""))}


def percentile_ranks(values: Sequence[float]) -> np.ndarray:
  """Mid-rank empirical percentile of each value among ``values``: (#below + #at-or-below) / (2n)."""
  v = np.asarray(values, np.float64)
  below = (v[None, :] < v[:, None]).sum(1)
  at_or_below = (v[None, :] <= v[:, None]).sum(1)
  return (below + at_or_below) / (2.0 * len(v))


def assign(table: Mapping[str, Mapping[str, float]]) -> dict:
  """Scores, cut-offs and strata for {task: {proxy: value}} (a missing proxy is 0)."""
  names = sorted(table)
  if not names:
    raise ValueError("no tasks to stratify")
  ranks = np.stack([percentile_ranks([float(table[n].get(p) or 0.0) for n in names]) for p in PROXIES])
  scores = ranks.mean(axis=0)
  cutoffs = [float(q) for q in np.quantile(scores, [0.25, 0.5, 0.75])]
  strata = {n: STRATA[int(np.searchsorted(cutoffs, s, side="left"))] for n, s in zip(names, scores)}
  return {"proxies": {n: {p: float(table[n].get(p) or 0.0) for p in PROXIES} for n in names},
          "scores": {n: float(s) for n, s in zip(names, scores)}, "cutoffs": cutoffs, "strata": strata}


def suite_strata(tasks, tasks_dir: str | Path, checker_counts: Mapping[str, int] | None = None,
                 path: str | Path | None = None) -> dict:
  """The suite's frozen strata: read from ``strata.json`` in ``tasks_dir`` (or ``path``) if it exists, else
  computed from ``tasks`` and written there. Tasks missing from a frozen file are reported as
  ``unstratified`` (the file is never silently changed)."""
  f = Path(path) if path else Path(tasks_dir) / STRATA_FILE
  if f.exists():
    data = json.loads(f.read_text())
    data["file"] = str(f)
    return data
  checker_counts = checker_counts or {}
  data = assign({t.name: proxies(t, checker_counts.get(t.name)) for t in tasks})
  data["definition"] = ("mean mid-rank percentile of checker scale, file footprint, instruction length; "
                        "quartile cut-offs, ties in the lower stratum (App. F)")
  try:
    f.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    data["file"] = str(f)
  except OSError:  # a read-only suite: the assignment is still returned (and stored with the results)
    data["file"] = None
  return data


def stratum_of(strata: Mapping, task: str) -> str:
  return strata.get("strata", {}).get(task, "unstratified")


def stratum_scores(per_task: Mapping[str, float | None], strata: Mapping,
                   infra: Mapping[str, int] | None = None) -> dict[str, dict]:
  """Task-weighted scores per stratum: {stratum: {"tasks": n, "scored_tasks": k, "infra_failures": attempts,
  "score": mean of the scored tasks' scores, in percent}}. A task's score is the mean of its full-pass
  indicators over its scored repeats (None: every attempt was an infrastructure failure); as in an evaluation's
  headline such tasks are left out of the score and their infrastructure failures (``infra``: {task: count})
  counted beside it. A stratum with no scored task has the score None."""
  infra = infra or {}
  out = {}
  for s in (*STRATA, "unstratified"):
    names = [t for t in per_task if stratum_of(strata, t) == s]
    if names:
      xs = [per_task[t] for t in names if per_task[t] is not None]
      out[s] = {"tasks": len(names), "scored_tasks": len(xs),
                "infra_failures": int(sum(infra.get(t, 0) for t in names)),
                "score": float(100.0 * np.mean(xs)) if xs else None}
  return out
