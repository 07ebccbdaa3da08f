"""Stage reports from fixed evaluation summaries: the Markdown table, report.json, readable PNGs."""

import json
import subprocess
import sys

from rsi_jax.config import REPO_ROOT
from rsi_jax.eval.report import build, load_stage, report_run, to_markdown, write_report


def summary(suite, mean, strata=None, infra=0):
  return {"suite": suite, "mean_at_r": mean, "pass_at_r": mean, "mean_at_r_with_infra_as_failure": mean,
          "infra_failures": infra, "n_tasks": 4, "by_stratum": strata or {}}


def stage_dirs(tmp_path):
  """Three stages, two suites; suite B has no evaluation at RSR-1."""
  spec = {"Base": {"A": (10.0, {"Easy": {"tasks": 2, "score": 20.0}, "Hard": {"tasks": 2, "score": 0.0}}),
                   "B": (20.0, None)},
          "RSR-1": {"A": (25.5, {"Easy": {"tasks": 2, "score": 50.0}, "Hard": {"tasks": 2, "score": 1.0}})},
          "RPR-1": {"A": (22.0, {"Easy": {"tasks": 2, "score": 40.0}, "Hard": {"tasks": 2, "score": 4.0}}),
                    "B": (30.0, None)}}
  dirs = []
  for name, suites in spec.items():
    for suite, (mean, strata) in suites.items():
      d = tmp_path / name / suite
      d.mkdir(parents=True)
      (d / "summary.json").write_text(json.dumps(summary(suite, mean, strata)))
    dirs.append((name, tmp_path / name))
  return dirs


EXPECTED = """# Evaluation report

Mean@R (%) per suite and stage; in brackets the change in points against the previous stage; each row's best stage in bold (none where all are equal). Infrastructure failures are left out of the headline (see report.json for the figures that count them as failures).

| Suite | Base | RSR-1 | RPR-1 |
|---|---:|---:|---:|
| A | 10.00 | **25.50 (+15.50)** | 22.00 (-3.50) |
| B | 20.00 | – | **30.00 (+10.00)** |
| Mean | 15.00 | – | **26.00 (+11.00)** |

## A: task-weighted score (%) per difficulty stratum

| Stratum | Tasks | Base | RSR-1 | RPR-1 |
|---|---:|---:|---:|---:|
| Easy | 2 | 20.00 | 50.00 | 40.00 |
| Hard | 2 | 0.00 | 1.00 | 4.00 |
"""


def test_markdown_table_from_fixed_inputs(tmp_path):
  stages = [(n, load_stage(d)) for n, d in stage_dirs(tmp_path)]
  rep = build(stages)
  assert to_markdown(rep) == EXPECTED
  assert rep["mean_at_r"]["B"]["RPR-1"]["delta"] == 10.0  # against the last stage that had B
  # the suite mean exists only where every suite was evaluated
  assert rep["suite_mean"]["RSR-1"]["mean_at_r"] is None and rep["suite_mean"]["Base"]["mean_at_r"] == 15.0
  flat = build([("a", {"S": summary("S", 0.0)}), ("b", {"S": summary("S", 0.0)})])
  assert not any(r["best"] for r in flat["mean_at_r"]["S"].values())  # all equal: nothing in bold


def test_report_files_and_pngs(tmp_path):
  stages = [(n, load_stage(d)) for n, d in stage_dirs(tmp_path)]
  rep = write_report(stages, tmp_path / "out")
  assert (tmp_path / "out" / "report.md").read_text() == EXPECTED
  assert json.loads((tmp_path / "out" / "report.json").read_text())["stages"] == ["Base", "RSR-1", "RPR-1"]
  for p in rep["plots"]:
    data = open(p, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_cli_and_training_run_layout(tmp_path):
  run = tmp_path / "run"
  for phase, mean in (("base", 0.0), ("rsr1", 50.0), ("rpr1", 75.0)):
    for step, m in ((3, mean / 2), (7, mean)):  # the last evaluation of a phase is its stage
      d = run / "eval" / phase / str(step)
      d.mkdir(parents=True)
      (d / "summary.json").write_text(json.dumps(summary("tasks", m)))
  (run / "lineage.json").write_text(json.dumps([{"phase": "rsr1"}, {"phase": "rpr1"}]))
  rep = report_run(run)
  assert rep["stages"] == ["base", "rsr1", "rpr1"]
  assert [rep["mean_at_r"]["tasks"][s]["mean_at_r"] for s in rep["stages"]] == [0.0, 50.0, 75.0]
  p = subprocess.run([sys.executable, "-m", "rsi_jax.eval.report", f"--runs={run}/eval/base/7,{run}/eval/rpr1/7",
                      "--names=Base,RPR-1", f"--output={tmp_path}/r"], cwd=REPO_ROOT, capture_output=True,
                     text=True, timeout=120)
  assert p.returncode == 0, p.stderr
  assert "| tasks | 0.00 | **75.00 (+75.00)** |" in p.stdout
  bad = subprocess.run([sys.executable, "-m", "rsi_jax.eval.report", f"--runs={tmp_path}/none",
                        f"--output={tmp_path}/r2"], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=120)
  assert bad.returncode == 2 and "no summary.json" in bad.stderr
