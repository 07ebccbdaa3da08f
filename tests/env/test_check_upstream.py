"""scripts/check_upstream.py: the oracle over a folder of upstream task folders, one row per folder."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rsi_jax.config import REPO_ROOT

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"
sys.path.insert(0, str(REPO_ROOT / "scripts"))
import check_upstream  # noqa: E402


def test_sample_is_even_and_whole_when_small():
  names = [f"t{i:02d}" for i in range(10)]
  assert check_upstream.sample(names, 3) == ["t00", "t03", "t06"]
  assert check_upstream.sample(names, None) == names and check_upstream.sample(names, 50) == names


def test_rows_classify_every_folder(tmp_path):
  """Verified, refused, infrastructure (reachable or not), scored 0, and a folder that is in neither file."""
  (tmp_path / "summary.json").write_text(json.dumps({"refused": [
      {"task": "img", "reason": "base image ghcr.io/x/y: registry_only (only a registry has it)"},
      {"task": "bad", "reason": "task.yaml: invalid YAML"}]}))
  attempts = [
      {"task": "ok", "success": 1, "infra_failure": False, "seconds": 3.0},
      {"task": "zero", "success": 0, "infra_failure": False, "passed": 1, "total": 2, "reason": "", "seconds": 4},
      {"task": "net", "success": None, "infra_failure": True, "failure_kind": "build_failed",
       "error": "image build failed: curl: (6) Could not resolve host: proxy.golang.org", "seconds": 9},
      {"task": "hang", "success": None, "infra_failure": True, "failure_kind": "verifier_timeout",
       "error": "verifier timed out after 5s", "seconds": 6}]
  (tmp_path / "attempts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in attempts))
  table = check_upstream.rows("ds", ["ok", "zero", "net", "hang", "img", "bad", "gone"], tmp_path)
  by = {r["task"]: r for r in table}
  assert by["ok"]["verified"] and by["ok"]["kind"] == ""
  assert by["zero"]["kind"] == "scored_0" and "1/2" in by["zero"]["reason"]
  assert by["net"]["kind"] == "build_failed" and by["net"]["unreachable"]
  assert by["hang"]["kind"] == "verifier_timeout" and not by["hang"]["unreachable"]
  assert by["img"]["kind"] == "refused" and not by["img"]["loaded"] and by["img"]["unreachable"]
  assert by["bad"]["kind"] == "refused" and not by["bad"]["unreachable"]
  assert by["gone"]["kind"] == "missing"
  text = check_upstream.render(table)
  assert "tasks 7: verified 1" in text and "scored_0 1" in text and "refused 2" in text
  # of the 5 whose requirements are reachable (net and img are not), 1 verified and 1 scored 0
  assert "unreachable requirements 2; of the other 5: verified 1 (20.0%), scored 0 1" in text


@pytest.mark.docker
@pytest.mark.slow
def test_check_upstream_end_to_end(tmp_path, docker_client):
  """A dataset of three folders: a TB1 task its solution solves, the same task with a wrong solution, and a
  folder that holds no task. The script prints a row for each and exits 0."""
  ds = tmp_path / "ds"
  shutil.copytree(FIXTURES / "tb1-word-sum", ds / "a-good")
  shutil.copytree(FIXTURES / "tb1-word-sum", ds / "b-wrong")
  (ds / "b-wrong" / "solution.sh").write_text("#!/bin/bash\necho 0 > /app/sum.txt\n")
  (ds / "c-empty").mkdir()
  (ds / "c-empty" / "README.md").write_text("not a task\n")
  out = tmp_path / "out"
  p = subprocess.run([sys.executable, "scripts/check_upstream.py", str(ds), "--output", str(out),
                      "--config", "configs/smoke.yml", "env.concurrency=2"],
                     cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
  table = {r["task"]: r for r in json.loads((out / "table.json").read_text())}
  assert set(table) == {"a-good", "b-wrong", "c-empty"}
  assert table["a-good"]["verified"] and table["a-good"]["seconds"] is not None
  assert table["b-wrong"]["kind"] == "scored_0"
  assert table["c-empty"]["kind"] == "refused" and "task.yaml" in table["c-empty"]["reason"]
  assert "tasks 3: verified 1" in p.stdout
