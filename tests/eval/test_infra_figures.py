"""Figures per difficulty, family and stratum treat infrastructure failures as the headline does (left out of the
scores, counted beside them; "n/a (k infra)" where nothing was scored), and infrastructure failures are counted per
kind and per task."""

import numpy as np
import pytest

from rsi_jax.eval.report import build, to_markdown
from rsi_jax.eval.run import EvalReport

NAN = np.nan


def _report():
  # a: easy/files, solved 1 of 2 (no infra); b: easy/files, 1 scored success + 1 build failure;
  # c: hard/net, both attempts infrastructure failures of two kinds
  scores = np.array([[1, 0], [1, NAN], [NAN, NAN]], float)
  kinds = {("b", 1): "build_failed", ("c", 0): "needs_network", ("c", 1): "verifier_error"}
  episodes = [{"task": t, "run": r, "infra_failure": (t, r) in kinds, "failure_kind": kinds.get((t, r), "")}
              for t in "abc" for r in range(2)]
  strata = {"strata": {"a": "Easy", "b": "Easy", "c": "Hard"}}
  return EvalReport(["a", "b", "c"], ["easy", "easy", "hard"], scores, scores.copy(), 3, episodes,
                    ["files", "files", "net"], strata, 0, {"suite": "S"},
                    refused=[{"task": "d", "reason": "symlink environment/x -> /etc/shadow leaves the task folder"}])


def test_groups_follow_the_headline_and_count_infrastructure_failures_beside():
  m = _report().metrics()
  assert m["mean_at_r"] == pytest.approx(100 * 2 / 3)  # 3 scored attempts, 2 successes
  easy, hard = m["by_difficulty"]["easy"], m["by_difficulty"]["hard"]
  assert easy["mean_at_r"] == pytest.approx(100 * 2 / 3) and easy["infra_failures"] == 1
  assert easy["mean_at_r_with_infra_as_failure"] == 50.0
  assert hard["mean_at_r"] is None and hard["pass_at_r"] is None and hard["infra_failures"] == 2
  assert m["by_family"]["net"]["mean_at_r"] is None and m["by_family"]["files"]["infra_failures"] == 1
  assert m["by_stratum"]["Easy"] == {"tasks": 2, "scored_tasks": 2, "infra_failures": 1, "score": 75.0}
  assert m["by_stratum"]["Hard"] == {"tasks": 1, "scored_tasks": 0, "infra_failures": 2, "score": None}
  assert m["infra_by_kind"] == {"build_failed": 1, "needs_network": 1, "verifier_error": 1}


def test_summary_counts_infrastructure_failures_per_kind_per_task_and_lists_refusals():
  s = _report().summary()
  assert s["per_task"]["c"]["infra"] == {"needs_network": 1, "verifier_error": 1}
  assert s["per_task"]["c"]["infra_failures"] == 2 and s["per_task"]["c"]["mean"] is None
  assert s["per_task"]["c"]["mean_with_infra_as_failure"] == 0.0
  assert s["per_task"]["b"]["infra"] == {"build_failed": 1} and s["per_task"]["b"]["mean"] == 1.0
  assert s["per_task"]["a"]["infra"] == {} and s["per_task"]["a"]["mean"] == 0.5
  assert s["refused"] == [{"task": "d", "reason": "symlink environment/x -> /etc/shadow leaves the task folder"}]


def test_console_says_n_a_with_the_infrastructure_count_never_zero():
  text = _report().render()
  assert "  difficulty hard: 1 task, n/a (2 infra)" in text
  assert "  family net: 1 task, n/a (2 infra)" in text
  assert "  stratum Hard: 1 task, score n/a (2 infra)" in text
  assert "  difficulty easy: 2 tasks, Mean@R 66.67%, pass@R 100.00% (1 infra)" in text
  assert "infrastructure failures left out of the scores, counted beside them" in text
  assert "infrastructure failures  3 (after 0 retried attempt(s)), build_failed 1, needs_network 1, " \
         "verifier_error 1" in text
  assert "  task c: needs_network x1, verifier_error x1" in text
  assert "refused 1 task folder(s), not evaluated:\n  d: symlink environment/x -> /etc/shadow" in text
  assert " 0.00%" not in text


def test_report_shows_n_a_for_a_stratum_of_infrastructure_failures_and_the_refused_folders():
  rep = build([("Base", {"S": _report().summary()})])
  md = to_markdown(rep)
  assert "| Hard | 1 | n/a (2 infra) |" in md and "| Easy | 2 | 75.00 (1 infra) |" in md
  assert "| Base | S | d | symlink environment/x -> /etc/shadow leaves the task folder |" in md


def test_a_suite_where_nothing_loaded_reports_the_refusals():
  rep = EvalReport([], [], np.zeros((0, 2)), np.zeros((0, 2)), 0, refused=[{"task": "x", "reason": "why"}])
  m = rep.metrics()
  assert m["n_tasks"] == 0 and m["mean_at_r"] is None and m["n_refused"] == 1
  assert "x: why" in rep.render() and rep.summary()["refused"] == [{"task": "x", "reason": "why"}]
