"""Evaluation runs on real shipped tasks in Docker: the reference solutions score 100%, an agent that
declares success at once scores 0%, and the entry point prints the metrics."""

import json
import subprocess
import sys

import pytest

from rsi_jax.config import CONFIG_DIR, REPO_ROOT, load_config
from rsi_jax.eval.run import evaluate

pytestmark = [pytest.mark.docker, pytest.mark.slow]
TASKS = ["file-ops-backup-archive", "text-processing-error-summary"]


@pytest.fixture(scope="module")
def pool_and_tasks(docker_client):
  from rsi_jax.env import EnvPool, load_tasks
  cfg = load_config(CONFIG_DIR / "smoke.yml", ["env.concurrency=2"])
  pool = EnvPool.from_config(cfg.env, "pytest-eval")
  yield pool, load_tasks(REPO_ROOT / "tasks", TASKS)
  pool.close()


def test_oracle_scores_everything(pool_and_tasks):
  from rsi_jax.env import make_harness
  pool, tasks = pool_and_tasks
  rep = evaluate(pool, tasks, lambda: make_harness("oracle"), repeats=2)
  m = rep.metrics()
  assert rep.scores.shape == (2, 2) and m["mean_at_r"] == 100.0 and m["pass_at_r"] == 100.0
  assert m["process_reward"] == 1.0 and m["strict_completions"] == 2.0 and m["infra_failures"] == 0
  assert [(e["task"], e["run"], e["success"], e["tries"]) for e in rep.episodes] == [
      (TASKS[0], 0, 1, 1), (TASKS[0], 1, 1, 1), (TASKS[1], 0, 1, 1), (TASKS[1], 1, 1, 1)]


def test_immediate_done_scores_nothing(pool_and_tasks):
  from rsi_jax.env import JsonHarness, ScriptedPolicy
  from rsi_jax.models import ChatRenderer, load_tokenizer
  from rsi_jax.policy import SamplingParams
  pool, tasks = pool_and_tasks
  tok = load_tokenizer()
  factory = lambda: JsonHarness(ScriptedPolicy(tok, ['{"done": true}']), ChatRenderer(tok),  # noqa: E731
                                SamplingParams(max_new_tokens=32), max_turns=2)
  rep = evaluate(pool, tasks, factory, repeats=1)
  m = rep.metrics()
  assert m["mean_at_r"] == 0.0 and m["pass_at_r"] == 0.0 and m["infra_failures"] == 0
  assert m["process_reward"] < 1.0
  assert [e["actions"] for e in rep.episodes] == [["<done>"], ["<done>"]]


def test_attempt_records_say_what_the_agent_did(pool_and_tasks):
  """attempts.jsonl keeps each turn's action (a command, cut at ACTION_CHARS, or the malformed text and why),
  so a failed attempt can be read without rerunning it."""
  from rsi_jax.env import JsonHarness, ScriptedPolicy
  from rsi_jax.eval.run import ACTION_CHARS
  from rsi_jax.models import ChatRenderer, load_tokenizer
  from rsi_jax.policy import SamplingParams
  pool, tasks = pool_and_tasks
  tok = load_tokenizer()
  long = "echo " + "x" * 400
  replies = ['{"command": "ls /app"}', "not json", '{"command": "' + long + '", "done": true}']
  factory = lambda: JsonHarness(ScriptedPolicy(tok, replies), ChatRenderer(tok),  # noqa: E731
                                SamplingParams(max_new_tokens=256), max_turns=3)
  (e,) = evaluate(pool, tasks[:1], factory, repeats=1).episodes
  assert e["success"] == 0 and len(e["actions"]) == 3
  assert e["actions"][0] == "ls /app"
  assert e["actions"][1].startswith("<malformed: ") and e["actions"][1].endswith("> not json")
  assert e["actions"][2] == long[:ACTION_CHARS] + "..."


def test_bad_arguments(pool_and_tasks):
  pool, tasks = pool_and_tasks
  with pytest.raises(ValueError, match="repeats must be > 0"):
    evaluate(pool, tasks, None, repeats=0)
  with pytest.raises(ValueError, match="no tasks"):
    evaluate(pool, [], None, repeats=1)


def test_entry_point(tmp_path, docker_client):
  out = tmp_path / "out"
  p = subprocess.run([sys.executable, "-m", "rsi_jax.eval", "--harness=oracle", "--repeats=1",
                      f"--tasks={TASKS[0]}", f"--output={out}"], cwd=REPO_ROOT, capture_output=True, text=True,
                     timeout=300)
  assert p.returncode == 0, p.stderr[-2000:]
  assert "Mean@1  100.00%" in p.stdout
  summary = json.loads((out / "summary.json").read_text())
  assert summary["pass_at_r"] == 100.0 and summary["n_tasks"] == 1 and summary["runs"] == 1
  assert summary["per_task"][TASKS[0]]["scores"] == [1] and summary["infra_failures"] == 0
  (attempt,) = [json.loads(x) for x in (out / "attempts.jsonl").read_text().splitlines()]
  assert attempt["task"] == TASKS[0] and attempt["success"] == 1 and attempt["passed"] == attempt["total"] > 0
  bad = subprocess.run([sys.executable, "-m", "rsi_jax.eval", "rl.clip_lo=1"], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=120)
  assert bad.returncode == 2 and "rl.clip_lo: unknown config key" in bad.stderr
  missing = subprocess.run([sys.executable, "-m", "rsi_jax.eval", f"--tasks_dir={tmp_path}/none"], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=120)
  assert missing.returncode == 2 and "tasks directory does not exist" in missing.stderr


def test_infrastructure_failures_are_retried_then_reported(pool_and_tasks, tmp_path):
  """A task whose image cannot be built: every attempt is an infrastructure failure, retried
  eval.infra_retries times, then reported apart — never a silent 0 in the headline."""
  import shutil

  from rsi_jax.env import load_task, make_harness
  pool, tasks = pool_and_tasks
  broken = tmp_path / "broken-build"
  shutil.copytree(REPO_ROOT / "tasks" / TASKS[0], broken)
  (broken / "environment" / "Dockerfile").write_text("FROM rsi-base\nRUN exit 3\n")
  rep = evaluate(pool, [tasks[0], load_task(broken)], lambda: make_harness("oracle"), repeats=2, infra_retries=1)
  m = rep.metrics()
  assert m["infra_failures"] == 2 and m["infra_retries"] == 2 and m["scored_attempts"] == 2
  assert m["mean_at_r"] == 100.0 and m["mean_at_r_with_infra_as_failure"] == 50.0
  assert m["pass_at_r"] == 100.0 and m["pass_at_r_with_infra_as_failure"] == 50.0
  bad = [e for e in rep.episodes if e["task"] == "broken-build"]
  assert len(bad) == 2 and all(e["infra_failure"] and e["tries"] == 2 and e["failure_kind"] for e in bad)
  assert "infrastructure failures as failures: 50.00%" in rep.render()


def test_oracle_over_a_folder_of_upstream_format_tasks(tmp_path, docker_client):
  """A folder a user brings: the shipped upstream-layout tasks (TB1 and Harbor/TB2) and fixtures written in
  upstream patterns (a TB1 task with parser_name pytest, a Harbor verifier run from the working directory),
  loaded unchanged through --tasks_dir: the reference solutions score 100 with no infrastructure failure."""
  import shutil
  suite = tmp_path / "upstream-format"
  for src in (REPO_ROOT / "tasks" / "upstream-tb1-collect-todos", REPO_ROOT / "tasks" / "upstream-tb2-rotate-logs",
              REPO_ROOT / "tests/env/fixtures/tasks/tb1-word-sum", REPO_ROOT / "tests/env/fixtures/tasks/harbor-calc"):
    shutil.copytree(src, suite / src.name)
  out = tmp_path / "out"
  p = subprocess.run([sys.executable, "-m", "rsi_jax.eval", "--harness=oracle", "--repeats=1",
                      f"--tasks_dir={suite}", f"--output={out}", "eval.max_tasks=0"], cwd=REPO_ROOT, capture_output=True, text=True,
                     timeout=600)
  assert p.returncode == 0, p.stderr[-2000:]
  s = json.loads((out / "summary.json").read_text())
  assert s["n_tasks"] == 4 and s["mean_at_r"] == 100.0 and s["infra_failures"] == 0 and s["infra_retries"] == 0
  assert (suite / "strata.json").exists() and s["strata"]["file"] == str(suite / "strata.json")
  assert sorted(v["stratum"] for v in s["per_task"].values()) != [None] * 4


class _SeedRecorder:
  """A sampler that records the seed of every request and answers ``{"done": true}``."""

  def __init__(self, tok):
    import threading
    self.tok, self.seeds, self.lock = tok, [], threading.Lock()

  def submit(self, prompt_ids, params):
    import concurrent.futures as cf

    import numpy as np

    from rsi_jax.policy import FINISH_EOS, Completion
    with self.lock:
      self.seeds.append(params.seed)
    ids = np.asarray(self.tok.encode('{"done": true}') + [self.tok.im_end_id], np.int32)
    fut = cf.Future()
    fut.set_result(Completion(ids, np.zeros(len(ids), np.float32), FINISH_EOS, 0, prompt_len=len(prompt_ids)))
    return fut

  def generate(self, prompt_ids, params):
    return self.submit(prompt_ids, params).result()

  def cancel(self, fut):
    pass


def test_deterministic_evaluation_seeds_every_attempt_by_task_and_repeat(pool_and_tasks):
  """With rollout.deterministic each attempt samples from its own seed (run seed, task, repeat, try), whatever
  ran beside it, so a rerun repeats the evaluation; without it the sampler chooses (seed None)."""
  from rsi_jax.env.rollouts import derive_seed
  from rsi_jax.eval.run import evaluate_policy
  from rsi_jax.models import ChatRenderer, load_tokenizer
  pool, tasks = pool_and_tasks
  tok = load_tokenizer()
  over = ["rollout.max_staleness=0", "eval.repeats=2", "eval.harness=json"]
  det = load_config(CONFIG_DIR / "smoke.yml", over + ["rollout.deterministic=true"])
  base = derive_seed(det.run.seed, "eval")
  want = sorted(derive_seed(derive_seed(base, t.name, r, 1), 0) for t in tasks for r in range(2))
  assert len(set(want)) == 4
  for _ in range(2):  # the same seeds on a rerun, one per attempt
    rec = _SeedRecorder(tok)
    evaluate_policy(det, pool, tasks, rec, ChatRenderer(tok))
    assert sorted(rec.seeds) == want
  rec = _SeedRecorder(tok)
  evaluate_policy(load_config(CONFIG_DIR / "smoke.yml", over), pool, tasks, rec, ChatRenderer(tok))
  assert rec.seeds == [None] * 4
