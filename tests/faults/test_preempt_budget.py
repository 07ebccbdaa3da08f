"""``run.preempt_budget_s``: whatever the stop still waits for when the budget is spent, the process ends then,
with its containers removed, and the rerun resumes from the newest complete checkpoint (a checkpoint write cut
short never replaces it). A budget far below what a stop takes (0.5 s against a checkpoint write and the
teardown) makes the limit bind for real."""

import re
import signal
import time

import pytest

from tests.pipeline.test_resume import _containers, _has_step, _start, _stop_when

pytestmark = [pytest.mark.slow, pytest.mark.docker]


def test_budget_spent_ends_the_process_and_the_rerun_resumes(tmp_path, docker_client):
  st = _stop_when(_start(tmp_path, "w", "run.preempt_budget_s=0.5"), lambda: _has_step(tmp_path / "w", "rsr1", 2),
                  signal.SIGTERM)
  assert st["rc"] == 0, st["out"] + st["err"][-3000:]
  assert st["seconds"] < 5, st
  assert ("preempted (SIGTERM): still stopping after run.preempt_budget_s=0.5 s: ended now; rerun the same command "
          "to resume from the newest complete checkpoint") in st["out"], st["out"]
  assert _containers(docker_client, "w") == []
  steps = sorted(int(p.name) for p in (tmp_path / "w" / "checkpoints" / "rsr1").iterdir() if p.name.isdigit())
  assert steps and steps[-1] <= 2
  p = _start(tmp_path, "w")  # the budget is not a training setting: no config change
  t0, out = time.time(), ""
  while "resuming after step" not in out and time.time() - t0 < 300 and p.poll() is None:
    out += p.stdout.readline()
  p.kill()
  p.communicate()
  assert re.search(rf"^\[rsr1\] resuming after step {steps[-1]} ", out, re.M), out
