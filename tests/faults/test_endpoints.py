"""Fault: a Docker endpoint dies mid-batch (issue 30).

A pool over the main daemon and a second real daemon runs oracle episodes; the second daemon is killed
(SIGTERM to its pid) while two episodes run on it. Every episode must still end scored: the two lost ones
run again on the main daemon (``infra_failures.retried``), and no run starts on the dead endpoint while it
is out of rotation. Started again on the same data root, it is probed, cleaned of the lost episodes'
containers and used again. With every endpoint down, episodes wait ``endpoint_wait_s`` and fail with one
line naming each endpoint and why it is down.
"""

import shutil
import time
import uuid

import pytest

from rsi_jax.env.episode import EnvSettings
from rsi_jax.env.harness import OracleHarness
from rsi_jax.env.pool import AllEndpointsDown, EnvPool
from rsi_jax.env.reaper import LABEL_RUN
from rsi_jax.env.sandbox import BUILD_FAILED
from rsi_jax.env.tasks import load_task
from tests.env.conftest import FIXTURES

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RUN_ID = f"pytest-endpoints-{uuid.uuid4().hex[:8]}"
SLEEP_S = 3  # the oracle's solution sleeps first: episodes are still running when the daemon is killed


@pytest.fixture(scope="module")
def settings():
  return EnvSettings(run_id=RUN_ID, command_timeout_s=30.0)


@pytest.fixture(scope="module")
def slow_task(tmp_path_factory):
  """harbor-greeting whose reference solution sleeps SLEEP_S seconds before it writes the answer."""
  d = tmp_path_factory.mktemp("tasks") / "harbor-slow-greeting"
  shutil.copytree(FIXTURES / "harbor-greeting", d)
  solve = d / "solution" / "solve.sh"
  lines = solve.read_text().splitlines()
  solve.write_text("\n".join([lines[0], f"sleep {SLEEP_S}", *lines[1:]]) + "\n")
  return load_task(d)


@pytest.fixture(scope="module")
def broken_task(tmp_path_factory):
  """harbor-greeting whose image build fails (RUN exit 3): the task's own failure, on any endpoint."""
  d = tmp_path_factory.mktemp("tasks") / "harbor-broken-build"
  shutil.copytree(FIXTURES / "harbor-greeting", d)
  (d / "environment" / "Dockerfile").write_text("FROM rsi-base\nRUN exit 3\n")
  return load_task(d)


def _ours(client) -> list:
  return client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={RUN_ID}"}, ignore_removed=True)


def _wait(cond, timeout_s: float, what: str):
  t0 = time.time()
  while not cond():
    assert time.time() - t0 < timeout_s, f"timed out after {timeout_s:g} s waiting for {what}"
    time.sleep(0.1)


def test_dead_endpoint_is_left_retried_elsewhere_and_taken_back(docker_client, second_daemon, settings,
                                                                slow_task, broken_task):
  d2 = second_daemon
  d2.start()
  c2 = d2.client()
  n = 8
  with EnvPool(settings, hosts=["", d2.host], concurrency=4, probe_min_s=0.5, probe_max_s=2.0) as pool:
    pool.prebuild([slow_task])  # the task image on both daemons
    futs = [pool.submit(slow_task, OracleHarness()) for _ in range(n)]
    _wait(lambda: len(_ours(c2)) >= 2, 60, "two episodes on the second daemon")
    t_kill = time.time()
    d2.kill()  # a real daemon death: SIGTERM to its pid, its containers killed, its socket gone
    results = [f.result(timeout=120) for f in futs]

    # every episode scored, as the oracle gives; the lost ones ran again on the live daemon
    bad = [(r.endpoint, r.failure_kind, r.error[-300:]) for r in results if r.success != 1 or r.infra_failure]
    assert not bad, bad
    retried = [r for r in results if r.retried_from]
    assert len(retried) >= 2, [(r.endpoint, r.retried_from) for r in results]
    assert all(r.retried_from == (d2.host,) and r.endpoint == "" for r in retried)
    assert pool.counts["infra_failures.retried"] == len(retried)
    assert pool.counts["episodes"] == n and pool.counts["infra_failures"] == 0
    status = pool.endpoint_status()[d2.host]
    assert not status["up"] and status["reason"] in ("socket missing", "connection refused"), status

    # started again on the same data root: probed, cleaned, in rotation again
    d2.start()
    _wait(lambda: pool.endpoint_status()[d2.host]["up"], 30, "the pool to take the second daemon back")
    assert _ours(c2) == []  # the lost episodes' containers (stopped with the daemon) were removed
    again = pool.run([(slow_task, OracleHarness())] * 4 + [(broken_task, OracleHarness())])
    *again, broken = again
    assert all(r.success == 1 and not r.retried_from for r in again), [(r.endpoint, r.error) for r in again]
    assert {r.endpoint for r in again} == {"", d2.host}
    # a task's own failure on a live endpoint is kept, not retried elsewhere
    assert broken.failure_kind == BUILD_FAILED and not broken.retried_from, (broken.failure_kind, broken.error)
    assert pool.counts["infra_failures.retried"] == len(retried) and pool.counts["infra_failures"] == 1

    downs = [t for t, ev, h, _ in pool.events if ev == "down" and h == d2.host]
    ups = [t for t, ev, h, _ in pool.events if ev == "up" and h == d2.host]
    assert len(downs) == 1 and len(ups) == 1 and t_kill < downs[0] < ups[0]
    # no run was sent to the dead endpoint: none from the kill until it was back
    sent = [t for t, ev, h, _ in pool.events if ev == "attempt" and h == d2.host and t_kill <= t < ups[0]]
    assert sent == []
  assert _ours(docker_client) == [] and _ours(c2) == []


def test_every_endpoint_down_fails_after_the_bounded_wait(docker_client, second_daemon, settings, slow_task):
  d2 = second_daemon
  d2.start()
  nowhere = f"unix:///tmp/rsi-no-daemon-{uuid.uuid4().hex[:6]}.sock"
  with pytest.raises(AllEndpointsDown, match="socket missing"):  # nothing answers at all: at once
    EnvPool(settings, hosts=[nowhere])
  wait_s = 3.0
  with EnvPool(settings, hosts=[d2.host, nowhere], concurrency=2, endpoint_wait_s=wait_s,
               probe_min_s=0.5, probe_max_s=1.0) as pool:
    assert [s["up"] for s in pool.endpoint_status().values()] == [True, False]
    d2.kill()
    t0 = time.time()
    futs = [pool.submit(slow_task, OracleHarness()) for _ in range(2)]
    errors = []
    for f in futs:
      with pytest.raises(AllEndpointsDown) as e:
        f.result(timeout=60)
      errors.append(str(e.value))
    dt = time.time() - t0
  assert wait_s <= dt < wait_s + 20, dt
  for msg in errors:
    assert "\n" not in msg and d2.host in msg and nowhere in msg and "endpoint_wait_s=3" in msg, msg
    assert msg.count("socket missing") + msg.count("connection refused") == 2, msg
  assert pool.counts["episodes"] == 0 and pool.counts["infra_failures.retried"] >= 1
  assert _ours(docker_client) == []
