"""Training's task pools from a suite with unusable folders: refused with their reasons and the run goes on
(env.strict_tasks: stops at the first), never starts with nothing to train on, and a resumed run's pool check
compares the pool it trains on."""

import json
import shutil

import pytest

from rsi_jax.config import CONFIG_DIR, REPO_ROOT, load_config
from rsi_jax.env.tasks import tasks_digest
from rsi_jax.pipeline.driver import Driver
from rsi_jax.pipeline.plan import PreflightError, build_plan, load_pool, preflight
from rsi_jax.pipeline.run_folder import checkpoint_root
from rsi_jax.pipeline.phases import pool_key

FIXTURES = REPO_ROOT / "tests" / "env" / "fixtures" / "tasks"


def _suite(root, good=("good-a", "good-b"), bad=("bad",)):
  root.mkdir(exist_ok=True)
  for name in good:
    shutil.copytree(FIXTURES / "harbor-greeting", root / name)
  for name in bad:
    shutil.copytree(FIXTURES / "harbor-greeting", root / name)
    (root / name / "task.toml").rename(root / name / "Task.toml")
  return root


def _cfg(tmp_path, suite, *ov):
  return load_config(CONFIG_DIR / "smoke.yml", [f"run.output_dir={tmp_path}", "run.name=t",
                                                f"env.tasks_dir={suite}", "eval.tasks_dir=", *ov])


def test_refused_folders_do_not_stop_training_unless_strict(tmp_path):
  suite = _suite(tmp_path / "suite")
  cfg = _cfg(tmp_path, suite)
  assert preflight(cfg, num_devices=4)
  pool, refused = load_pool(cfg)
  assert [t.name for t in pool] == ["good-a", "good-b"]
  assert [(r.task, r.reason) for r in refused] == [
      ("bad", "Task.toml: the metadata file must be named task.toml (names are case-sensitive)")]
  with pytest.raises(PreflightError) as e:
    preflight(_cfg(tmp_path, suite, "env.strict_tasks=true"), num_devices=4)
  assert str(e.value) == f"env.tasks_dir: {suite}/bad: Task.toml: the metadata file must be named task.toml " \
                         f"(names are case-sensitive)"


def test_nothing_loaded_refuses_to_start(tmp_path):
  suite = _suite(tmp_path / "suite", good=(), bad=("bad", "worse"))
  with pytest.raises(PreflightError) as e:
    preflight(_cfg(tmp_path, suite), num_devices=4)
  assert str(e.value) == (f"env.tasks_dir: {suite}: no task loaded, all 2 folder(s) refused (first: bad: Task.toml: "
                          f"the metadata file must be named task.toml (names are case-sensitive))")


def test_the_resume_check_compares_the_pool_without_its_refused_folders(tmp_path):
  suite = _suite(tmp_path / "suite")
  cfg = _cfg(tmp_path, suite)
  plan = build_plan(cfg)

  def pools():
    return {pool_key(c): load_pool(c)[0] for c in [cfg] + [s.cfg for s in plan]}

  first = plan[0]
  meta = tmp_path / "t" / "checkpoints" / first.name / "2" / "meta" / "metadata"
  assert str(meta).startswith(checkpoint_root(cfg))
  meta.parent.mkdir(parents=True)
  meta.write_text(json.dumps({"tasks_digest": tasks_digest(pools()[pool_key(first.cfg)])}))
  Driver(cfg)._check_pools(plan, pools())  # the same pool: resumes
  _suite(suite, good=("good-c",), bad=())
  with pytest.raises(PreflightError, match=rf"{first.name}: its checkpoint at step 2 was trained on another task "
                                           rf"pool"):
    Driver(cfg)._check_pools(plan, pools())


@pytest.mark.docker
def test_a_task_specific_image_is_refused_from_the_training_pool(tmp_path, docker_client):
  from rsi_jax.env import EnvPool
  suite = _suite(tmp_path / "suite", bad=())
  image = "ghcr.io/laude-institute/t-bench/deveval:latest"
  (suite / "good-b" / "environment" / "Dockerfile").write_text(f"FROM {image}\n")
  cfg = _cfg(tmp_path, suite)
  plan = build_plan(cfg)
  pool = EnvPool.from_config(cfg.env, "pytest-pools")
  try:
    try:
      docker_client.images.get(image)
      pytest.skip(f"{image} is present locally (it would be used as is)")
    except Exception:  # noqa: BLE001 - absent
      pass
    pools, refused = Driver(cfg)._task_pools(plan, pool)
  finally:
    pool.close()
  assert [t.name for t in pools[pool_key(cfg)]] == ["good-a"]
  (r,) = refused[str(suite)]
  assert r.task == "good-b" and r.reason.startswith(f"registry_only: base image {image} is the task-specific")
