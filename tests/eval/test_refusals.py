"""python -m rsi_jax.eval over a suite of task folders a user brings, some of them unusable: every folder is
evaluated or refused with its reason (console and summary.json), no traceback, the rest is scored; --strict stops
at the first refused folder; a task named twice runs once. Real Docker: image presence, builds, the oracle."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from rsi_jax.config import REPO_ROOT

pytestmark = [pytest.mark.docker, pytest.mark.slow]
FIXTURE = REPO_ROOT / "tests" / "env" / "fixtures" / "tasks" / "harbor-greeting"
DEVEVAL = "ghcr.io/laude-institute/t-bench/deveval:latest"


def _task(suite, name):
  d = suite / name
  shutil.copytree(FIXTURE, d)
  return d


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
  s = tmp_path_factory.mktemp("suite")
  _task(s, "good")
  broken = _task(s, "broken-build")  # its image cannot be built: an infrastructure failure, the only hard task
  (broken / "environment" / "Dockerfile").write_text("FROM rsi-base\nRUN exit 3\n")
  (broken / "task.toml").write_text((broken / "task.toml").read_text().replace('"easy"', '"hard"'))
  os.symlink("/etc/shadow", _task(s, "shadow") / "environment" / "secret")
  os.symlink("nowhere.txt", _task(s, "dangling") / "environment" / "data.txt")
  (_task(s, "non-utf8") / "environment" / os.fsdecode(b"caf\xe9")).write_text("x")
  shutil.rmtree(_task(s, "no-solution") / "solution")
  (s / "no-metadata").mkdir()
  (_task(s, "capitalised") / "task.toml").rename(s / "capitalised" / "Task.toml")
  (_task(s, "deveval") / "environment" / "Dockerfile").write_text(f"FROM --platform=linux/amd64 {DEVEVAL}\n")
  return s


def _eval(suite, out, *args):
  return subprocess.run([sys.executable, "-m", "rsi_jax.eval", "--harness=oracle", "--repeats=1",
                         f"--tasks_dir={suite}", f"--output={out}", "eval.max_tasks=0", "eval.infra_retries=0",
                         *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)


def test_unusable_folders_are_refused_with_their_reasons_and_the_rest_runs(suite, tmp_path, docker_client):
  try:
    docker_client.images.get(DEVEVAL)
    pytest.skip(f"{DEVEVAL} is present locally (it would be used as is)")
  except Exception:  # noqa: BLE001 - absent, as on a machine without the registry
    pass
  p = _eval(suite, tmp_path / "out")
  assert p.returncode == 0, p.stderr[-2000:]
  assert "Traceback" not in p.stdout + p.stderr
  s = json.loads((tmp_path / "out" / "summary.json").read_text())
  refused = {r["task"]: r["reason"] for r in s["refused"]}
  assert refused == {
      "shadow": "symlink environment/secret -> /etc/shadow leaves the task folder",
      "dangling": "symlink environment/data.txt -> nowhere.txt is dangling (its target does not exist)",
      "non-utf8": "file name is not UTF-8: environment/caf\\xe9",
      "no-solution": "no reference solution (solution/solve.sh) for the oracle harness to run",
      "no-metadata": "neither task.toml (Harbor / Terminal-Bench 2) nor task.yaml (Terminal-Bench 1)",
      "capitalised": "Task.toml: the metadata file must be named task.toml (names are case-sensitive)",
      "deveval": refused["deveval"]}
  assert refused["deveval"].startswith(f"registry_only: base image {DEVEVAL} is the task-specific Terminal-Bench "
                                       f"image t-bench/deveval")
  for name, reason in refused.items():
    assert f"  {name}: {reason}" in p.stdout
  attempts = [json.loads(x) for x in (tmp_path / "out" / "attempts.jsonl").read_text().splitlines()]
  assert sorted(a["task"] for a in attempts) == ["broken-build", "good"]
  assert s["n_tasks"] == 2 and s["mean_at_r"] == 100.0 and s["per_task"]["good"]["scores"] == [1]
  assert s["per_task"]["broken-build"]["infra"] == {"build_failed": 1} and s["infra_by_kind"] == {"build_failed": 1}
  assert "  difficulty hard: 1 task, n/a (1 infra)" in p.stdout
  assert "  task broken-build: build_failed x1" in p.stdout


def test_strict_stops_at_the_first_refused_folder(suite, tmp_path, docker_client):
  p = _eval(suite, tmp_path / "out", "--strict")
  assert p.returncode == 2 and not (tmp_path / "out").exists()
  assert p.stderr.strip().splitlines()[-1] == (f"cannot evaluate: {suite}/capitalised: Task.toml: the metadata file "
                                               f"must be named task.toml (names are case-sensitive)")


def test_a_task_named_twice_runs_once(suite, tmp_path, docker_client):
  p = _eval(suite, tmp_path / "out", "--tasks=good,good")
  assert p.returncode == 0, p.stderr[-2000:]
  attempts = (tmp_path / "out" / "attempts.jsonl").read_text().splitlines()
  s = json.loads((tmp_path / "out" / "summary.json").read_text())
  assert len(attempts) == 1 and s["n_tasks"] == 1 and s["refused"] == []
  assert s["notes"] == ["task good is named 2 times: evaluated once"] and "note: task good is named 2 times" in p.stdout
