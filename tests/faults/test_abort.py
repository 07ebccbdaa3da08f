"""Fault: an episode is aborted (oversampling's spare episodes, a stop notice, also during an evaluation) while
its agent command or its verification runs. The abort removes the container at once: the command or the
verifier ends with it, the episode counts as aborted (not an infrastructure failure), and nothing is left
behind."""

import os
import shutil
import signal
import threading
import time
import uuid

import pytest

from rsi_jax.env.episode import ABORTED, EnvSettings
from rsi_jax.env.harness import OracleHarness
from rsi_jax.env.pool import EnvPool
from rsi_jax.env.reaper import LABEL_RUN
from rsi_jax.env.tasks import load_task
from rsi_jax.env.rollouts import collect
from tests.env.conftest import FIXTURES

pytestmark = [pytest.mark.docker]

RUN_ID = f"pytest-abort-{uuid.uuid4().hex[:8]}"
LONG_S = 90  # what the slow part would take without the abort


def _variant(root, name: str, solve_sleep: int = 0, verify_sleep: int = 0):
  d = root / name
  shutil.copytree(FIXTURES / "harbor-greeting", d)
  for f, s in ((d / "solution" / "solve.sh", solve_sleep), (d / "tests" / "test.sh", verify_sleep)):
    if s:
      lines = f.read_text().splitlines()
      f.write_text("\n".join([lines[0], f"sleep {s}", *lines[1:]]) + "\n")
  return load_task(d)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
  root = tmp_path_factory.mktemp("tasks")
  return {"quick": _variant(root, "harbor-quick"), "slow_agent": _variant(root, "harbor-slow-agent", LONG_S),
          "slow_verifier": _variant(root, "harbor-slow-verifier", verify_sleep=LONG_S)}


@pytest.fixture(scope="module")
def pool(docker_client):
  p = EnvPool(EnvSettings(run_id=RUN_ID, command_timeout_s=2 * LONG_S, verifier_timeout_s=2 * LONG_S),
              concurrency=3)
  yield p
  p.close()


def test_oversampling_abort_ends_a_running_command_and_a_running_verification(pool, tasks, docker_client):
  pool.prebuild(tasks.values())
  jobs = [(tasks[k], OracleHarness(), threading.Event()) for k in ("quick", "slow_agent", "slow_verifier")]
  t0 = time.time()
  got, aborted = collect(pool, jobs, 1, deterministic=False)  # the first to finish is used, the rest stopped
  took = time.time() - t0
  assert [r.task for r in got] == ["harbor-quick"] and got[0].success == 1
  assert aborted == 2
  assert took < 30, f"collect took {took:.0f}s: the aborted command / verification ran on"
  assert pool.counts["aborted"] == 2 and pool.counts["infra_failures"] == 0
  assert docker_client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={RUN_ID}"}, ignore_removed=True) == []


def test_abort_during_verification_is_counted_as_aborted(pool, tasks, docker_client):
  ev = threading.Event()
  fut = pool.submit(tasks["slow_verifier"], OracleHarness(), abort=ev)
  t0 = time.time()
  while (not docker_client.containers.list(filters={"label": f"{LABEL_RUN}={RUN_ID}"}, ignore_removed=True)
         and time.time() - t0 < 60):
    time.sleep(0.05)
  time.sleep(3)  # the oracle's solution is quick: the verifier's sleep is running now
  ev.set()
  t1 = time.time()
  r = fut.result(timeout=30)
  assert time.time() - t1 < 10
  assert r.failure_kind == ABORTED and r.success is None and r.infra_failure
  assert docker_client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={RUN_ID}"}, ignore_removed=True) == []


def test_sigterm_during_an_evaluation_aborts_its_attempts(pool, tasks, docker_client):
  """A real SIGTERM to this process, taken by the training program's handler, while an evaluation's attempts run
  an agent command and a verification: both are aborted at once (containers removed, counted as aborted) and
  the evaluation raises StopRequested instead of returning a report."""
  from rsi_jax.eval.run import evaluate
  from rsi_jax.pipeline.preemption import Stop
  from rsi_jax.stop import StopRequested
  slow = [tasks["slow_agent"], tasks["slow_verifier"]]
  pool.prebuild(slow)
  before = pool.counts["aborted"]

  def notice():
    t0 = time.time()
    while (len(docker_client.containers.list(filters={"label": f"{LABEL_RUN}={RUN_ID}"}, ignore_removed=True)) < 2
           and time.time() - t0 < 60):
      time.sleep(0.05)
    time.sleep(3)  # the agent's command and the verifier's sleep are running now
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=notice, daemon=True).start()
  t0 = time.time()
  with Stop() as stop, pytest.raises(StopRequested, match="SIGTERM"):
    evaluate(pool, slow, OracleHarness, 1, stop=stop)
  took = time.time() - t0
  assert took < 30, f"the evaluation took {took:.0f}s: its attempts ran on after the notice"
  assert pool.counts["aborted"] - before == 2 and pool.counts["infra_failures"] == 0
  assert docker_client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={RUN_ID}"}, ignore_removed=True) == []
