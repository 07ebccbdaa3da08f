"""Frozen structural strata (App. F) against hand-computed values."""

import json
import shutil

import numpy as np
import pytest

from rsi_jax.config import REPO_ROOT
from rsi_jax.env.tasks import load_task, load_tasks
from rsi_jax.eval.strata import (STRATA_FILE, assign, file_footprint, percentile_ranks, proxies, stratum_scores,
                                 static_test_functions, suite_strata)


def test_mid_rank_percentiles():
  assert percentile_ranks([1, 2, 2, 3]).tolist() == [0.125, 0.5, 0.5, 0.875]
  assert percentile_ranks([5]).tolist() == [0.5]


def test_assignment_by_hand():
  """Four tasks; d's file footprint is missing (zero); b and c tie, and their score is the median cut-off:
  ties go to the lower stratum.
    checker scale 1,2,2,3 -> .125 .5 .5 .875; footprint 1,2,2,0 -> .375 .75 .75 .125;
    instruction 10,20,20,30 -> .125 .5 .5 .875; scores a .208333, b = c .583333, d .625;
    quartiles (linear) .489583, .583333, .59375."""
  table = {"a": {"checker_scale": 1, "file_footprint": 1, "instruction_length": 10},
           "b": {"checker_scale": 2, "file_footprint": 2, "instruction_length": 20},
           "c": {"checker_scale": 2, "file_footprint": 2, "instruction_length": 20},
           "d": {"checker_scale": 3, "instruction_length": 30}}
  out = assign(table)
  assert out["scores"] == pytest.approx({"a": 0.625 / 3, "b": 1.75 / 3, "c": 1.75 / 3, "d": 1.875 / 3})
  assert out["cutoffs"] == pytest.approx([0.489583333, 1.75 / 3, 0.59375])
  assert out["strata"] == {"a": "Easy", "b": "Medium", "c": "Medium", "d": "Extreme"}
  assert out["proxies"]["d"]["file_footprint"] == 0.0


def test_proxies_of_a_shipped_task():
  t = load_task(REPO_ROOT / "tasks" / "file-ops-backup-archive")
  assert static_test_functions(t) == 3  # three test_* functions in tests/test_outputs.py
  # environment: Dockerfile + 9 project files; tests: 2; solution: solve.sh + partial.sh
  assert file_footprint(t) == 1 + 9 + 2 + 2
  p = proxies(t, checker_count=5)
  assert p == {"checker_scale": 5.0, "file_footprint": 14.0, "instruction_length": float(len(t.instruction))}
  assert proxies(t)["checker_scale"] == 3.0


def test_strata_are_frozen_with_the_suite(tmp_path):
  suite = tmp_path / "suite"
  for name in ("file-ops-backup-archive", "text-processing-config-edit", "shell-scripting-retry",
               "python-fix-csv-stats", "data-aggregation-sales-report"):
    shutil.copytree(REPO_ROOT / "tasks" / name, suite / name)
  first = suite_strata(load_tasks(suite), suite)
  assert (suite / STRATA_FILE).exists() and first["file"] == str(suite / STRATA_FILE)
  assert sorted(first["strata"]) == sorted(p.name for p in suite.iterdir() if p.is_dir())
  # a task grows: the frozen assignment does not move
  inst = suite / "shell-scripting-retry" / "instruction.md"
  inst.write_text(inst.read_text() * 20)
  again = suite_strata(load_tasks(suite), suite)
  assert again["strata"] == first["strata"] and again["cutoffs"] == first["cutoffs"]
  assert json.loads((suite / STRATA_FILE).read_text())["strata"] == first["strata"]


def test_task_weighted_stratum_scores():
  strata = {"strata": {"a": "Easy", "b": "Easy", "c": "Hard"}}
  # task a solved in 1 of 2 scored repeats, b in 2 of 2; c never scored (2 infrastructure failures); d is not in
  # the frozen file
  out = stratum_scores({"a": 0.5, "b": 1.0, "c": None, "d": 1.0}, strata, {"c": 2})
  assert out == {"Easy": {"tasks": 2, "scored_tasks": 2, "infra_failures": 0, "score": 75.0},
                 "Hard": {"tasks": 1, "scored_tasks": 0, "infra_failures": 2, "score": None},
                 "unstratified": {"tasks": 1, "scored_tasks": 1, "infra_failures": 0, "score": 100.0}}
  assert np.isclose(out["Easy"]["score"], 100 * np.mean([0.5, 1.0]))
