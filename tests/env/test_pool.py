"""EnvPool over the shipped suite: the oracle passes every task, a do-nothing agent fails every task,
infrastructure failures are counted by kind, episodes spread over several endpoints."""

import re
import shutil

import pytest

from rsi_jax.env.harness import JsonHarness, OracleHarness, ScriptedPolicy
from rsi_jax.env.pool import EnvPool
from rsi_jax.env.sandbox import BUILD_FAILED, VERIFIER_TIMEOUT
from rsi_jax.env.tasks import load_task, load_tasks
from rsi_jax.policy import SamplingParams
from rsi_jax.rl.ctrf import VerificationState

from .conftest import FIXTURES, REPO

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def suite():
  if not (REPO / "tasks").is_dir():
    pytest.skip("no shipped tasks/ folder")
  return load_tasks(REPO / "tasks")


def test_shipped_suite_oracle_passes_and_nothing_fails(docker_client, settings, suite, tokenizer, renderer):
  nothing = lambda: JsonHarness(ScriptedPolicy(tokenizer, []), renderer, SamplingParams(), max_turns=1)
  with EnvPool(settings, concurrency=4) as pool:
    pool.prebuild(suite)
    oracle = pool.run([(t, OracleHarness()) for t in suite])
    idle = pool.run([(t, nothing) for t in suite])
  bad = [(r.task, r.outcome.reason, r.error, r.verifier_output[-500:]) for r in oracle if r.success != 1]
  assert not bad
  assert all(r.outcome.state == VerificationState.OK and r.outcome.passed == r.outcome.total > 0 for r in oracle)
  assert all(r.outcome.state == VerificationState.OK and r.success == 0 for r in idle), \
      [(r.task, r.outcome.reason) for r in idle if r.success != 0]
  # partial credit exists but never the full count
  assert all(r.outcome.passed < r.outcome.total for r in idle)
  upstream = [r for r in oracle if r.task.startswith("upstream-")]
  assert {r.task.split("-")[1] for r in upstream} == {"tb1", "tb2"}
  assert pool.counts["episodes"] == 2 * len(suite) and pool.counts["infra_failures"] == 0


class _BrokenPolicy:
  def generate(self, prompt_ids, params):
    raise RuntimeError("sampler went away")


def test_policy_error_is_recorded_not_raised(docker_client, settings, fixture_tasks, renderer):
  from rsi_jax.env.episode import AGENT_ERROR, run_episode
  h = JsonHarness(_BrokenPolicy(), renderer, SamplingParams())
  r = run_episode(fixture_tasks["harbor-greeting"], h, docker_client, settings)
  assert r.infra_failure and r.failure_kind == AGENT_ERROR and "sampler went away" in r.error


def test_container_killed_mid_episode(docker_client, settings, fixture_tasks, tokenizer, renderer):
  import threading
  import time
  from rsi_jax.env.episode import run_episode
  from rsi_jax.env.reaper import LABEL_EPISODE
  from rsi_jax.env.sandbox import CONTAINER_DIED

  def kill_it():
    for _ in range(100):
      found = docker_client.containers.list(filters={"label": f"{LABEL_EPISODE}=killme"}, ignore_removed=True)
      if found:
        time.sleep(1.0)
        found[0].kill()
        return
      time.sleep(0.1)

  h = JsonHarness(ScriptedPolicy(tokenizer, ['{"command": "sleep 30"}']), renderer, SamplingParams())
  threading.Thread(target=kill_it, daemon=True).start()
  r = run_episode(fixture_tasks["harbor-greeting"], h, docker_client, settings, episode_id="killme")
  assert r.infra_failure and r.failure_kind == CONTAINER_DIED and r.success is None


def test_daemon_error_on_create_is_recorded(docker_client, settings, fixture_tasks):
  import dataclasses
  from rsi_jax.env.episode import run_episode
  from rsi_jax.env.sandbox import CREATE_FAILED
  # a real daemon-side rejection at create time: the requested network does not exist
  bad = dataclasses.replace(settings, network="rsi-no-such-network")
  r = run_episode(fixture_tasks["harbor-greeting"], OracleHarness(), docker_client, bad)
  assert r.infra_failure and r.failure_kind == CREATE_FAILED and "rsi-no-such-network" in r.error


def test_infrastructure_failures_are_counted(docker_client, settings, fixture_tasks, tmp_path):
  broken = tmp_path / "harbor-broken-build"
  shutil.copytree(FIXTURES / "harbor-greeting", broken)
  (broken / "environment" / "Dockerfile").write_text("FROM rsi-base\nRUN exit 3\n")
  jobs = [(fixture_tasks["harbor-greeting"], OracleHarness()), (load_task(broken), OracleHarness()),
          (fixture_tasks["harbor-hanging-verifier"], OracleHarness())]
  # two endpoints reaching the same local daemon: the default socket and its explicit URL
  with EnvPool(settings, hosts=["", "unix:///var/run/docker.sock"], concurrency=3) as pool:
    ok, build, hang = pool.run(jobs)
  assert ok.success == 1 and not ok.infra_failure
  assert build.infra_failure and build.failure_kind == BUILD_FAILED and "harbor-broken-build" in build.error
  assert hang.infra_failure and hang.failure_kind == VERIFIER_TIMEOUT
  assert pool.counts["infra_failures"] == 2
  assert pool.counts[f"infra:{BUILD_FAILED}"] == 1 and pool.counts[f"infra:{VERIFIER_TIMEOUT}"] == 1
  assert {r.endpoint for r in (ok, build, hang)} == {"", "unix:///var/run/docker.sock"}
  # the failed build names its step, and is not retried per episode: the next one fails at once
  assert re.search(r"build failed at \S+/harbor-broken-build/environment/Dockerfile line \d+ \(RUN exit 3\)",
                   build.error), build.error
  from rsi_jax.env.episode import run_episode
  again = run_episode(load_task(broken), OracleHarness(), docker_client, settings)
  assert again.failure_kind == BUILD_FAILED and "cached: the same build failed earlier" in again.error
  assert again.build_s == 0.0 and again.total_s < 2
