"""The training program before any model is built: the plan, pre-flight errors, run-folder paths and the
defaults (that every config key does something: tests/test_config_keys.py)."""

import json
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rsi_jax.config import CONFIG_DIR, REPO_ROOT, Config, load_config
from rsi_jax.env.rollouts import TaskOrder, derive_seed
from rsi_jax.pipeline.driver import check_fresh
from rsi_jax.pipeline.plan import PreflightError, build_plan, preflight
from rsi_jax.pipeline.run_folder import checkpoint_root, run_dir_of
from rsi_jax.pipeline.errors import InvariantError

SMOKE = CONFIG_DIR / "smoke.yml"


def _cfg(tmp_path, *ov):
  return load_config(SMOKE, [f"run.output_dir={tmp_path}", "run.name=t", *ov])


def test_plan_kinds_sources_and_phase_configs(tmp_path):
  cli = ["pipeline.phases=[rpr1, rpr2]", "pipeline.critic_from.rpr2=init", "reward.kind=fdr"]
  plan = build_plan(_cfg(tmp_path, *cli), cli)
  assert [(p.name, p.kind, p.actor_from, p.critic_from) for p in plan] == [
      ("rpr1", "rpr", "previous", "previous"), ("rpr2", "rpr", "previous", "init")]
  assert plan[1].cfg.reward.kind == "fdr" and plan[1].cfg.actor_optim.learning_rate == 1e-7
  default = build_plan(_cfg(tmp_path))
  assert [p.kind for p in default] == ["rsr", "critic_seed", "rpr", "rsr", "rpr"]
  assert default[1].critic_from == "init"  # the critic seed starts a critic from the RSR-1 actor


@pytest.mark.parametrize("ov,msg", [
    (["env.tasks_dir={tmp}/nowhere"], "env.tasks_dir: {tmp}/nowhere: tasks directory does not exist"),
    (["env.tasks_dir={tmp}/empty"], "env.tasks_dir: {tmp}/empty: no task folder"),
    (["reward.divisor_table={tmp}/table.json"], "reward.divisor_table: cannot read"),
    (["mesh.ici_fsdp_parallelism=8", "mesh.ici_tensor_parallelism=1", "rollout.global_batch=8",
      "rollout.requested=8"], "mesh.ici_fsdp_parallelism: ICI axes multiply to 8"),
    (["mesh.ici_fsdp_parallelism=-1", "mesh.ici_tensor_parallelism=1", "rollout.global_batch=2",
      "rollout.requested=2"], "rollout.global_batch: 2 is not divisible by the mesh's batch shards (data x fsdp = 4"),
    (["reward.divisor_table=configs/rewards/fallback-82.json", "pipeline.phases=[rpr2]"],
     "configs/rewards/fallback-82.json is a table for 'fdr' rewards but phase rpr2 uses reward.kind='spr'"),
    (["pipeline.actor_from.rpr1={tmp}/no-ckpt"], "pipeline.actor_from.rpr1: checkpoint {tmp}/no-ckpt: does not exist"),
    (["rsr.plan_template={tmp}/plan.md"], "rsr.plan_template (phase rsr1): RSR template {tmp}/plan.md: cannot read"),
])
def test_preflight_errors_are_one_line(tmp_path, ov, msg):
  (tmp_path / "empty").mkdir()
  (tmp_path / "table.json").write_text("{not json")
  ov = [o.format(tmp=tmp_path) for o in ov]
  with pytest.raises(PreflightError) as e:
    preflight(_cfg(tmp_path, *ov), ov, num_devices=4)
  assert msg.format(tmp=tmp_path) in str(e.value) and "\n" not in str(e.value)


def test_preflight_names_the_cpu_device_flag(tmp_path):
  with pytest.raises(PreflightError, match="xla_force_host_platform_device_count"):
    preflight(_cfg(tmp_path), num_devices=1)


def test_resume_never_refuses_a_run_folder_that_holds_a_run(tmp_path):
  cfg = _cfg(tmp_path, "run.resume=never")
  assert preflight(cfg, num_devices=4)  # an empty (or missing) run folder is fine
  (tmp_path / "t").mkdir()
  (tmp_path / "t" / "train.log").write_text("a log alone is not a run\n")
  assert preflight(cfg, num_devices=4)
  (tmp_path / "t" / "lineage.json").write_text("[]")
  with pytest.raises(PreflightError, match=r"run\.resume=never but the run folder .*/t already holds a run "
                                           r"\(lineage\.json\)"):
    preflight(cfg, num_devices=4)
  assert preflight(_cfg(tmp_path), num_devices=4)  # resume=auto takes it up


def test_object_store_paths_are_not_mangled(tmp_path):
  cfg = load_config(SMOKE, ["run.output_dir=gs://bucket/runs", "run.name=exp1"])
  assert run_dir_of(cfg) == "gs://bucket/runs/exp1"
  assert checkpoint_root(cfg) == "gs://bucket/runs/exp1/checkpoints"
  cfg = load_config(SMOKE, ["pipeline.checkpoint_dir=gs://other-bucket/ckpt/"])
  assert checkpoint_root(cfg) == "gs://other-bucket/ckpt/"
  from rsi_jax.models.checkpoint import join, local_or_url
  assert local_or_url("gs://b/x/../y") == "gs://b/x/../y" and join("gs://b/x/", "rpr1", "40") == "gs://b/x/rpr1/40"
  assert local_or_url("rel/dir") == str(Path.cwd() / "rel/dir")


def test_defaults_serve_the_first_prompt_of_every_shipped_task():
  """configs/base.yml's sampler limits must admit each shipped task's first prompt with room to generate,
  and the summarization threshold the harness ends up with must be reachable."""
  from rsi_jax.env import load_tasks, make_harness
  from rsi_jax.env.harness import summarize_threshold
  from rsi_jax.models import ChatRenderer, load_tokenizer
  cfg = load_config(CONFIG_DIR / "base.yml")
  tok = load_tokenizer(cfg.model.tokenizer_path)

  from rsi_jax.sampler.request import prompt_limit

  class Limits:  # what the harness reads from the sampler: the limit SamplerServer.from_config(cfg) serves
    max_prompt_tokens = prompt_limit(cfg.sampler.decode_impl == "paged", cfg.sampler.max_cache_length,
                                     cfg.sampler.max_prefill_length, cfg.rollout.max_input_tokens)

  # The paper's limits, not lowered: 96,000-token prompts, summarization at 32,000 accumulated tokens.
  assert Limits.max_prompt_tokens == cfg.rollout.max_input_tokens == 96_000
  assert summarize_threshold(cfg.env.summarize_threshold_tokens, Limits()) == 32_000
  assert cfg.sampler.max_cache_length >= cfg.rollout.max_input_tokens + cfg.rollout.max_new_tokens
  h = make_harness(cfg.env.harness, Limits(), ChatRenderer(tok), env_cfg=cfg.env)
  lengths = [len(h.initial_prompt(t)) for t in load_tasks(cfg.env.tasks_dir)]
  assert lengths and max(lengths) < 32_000


def test_task_order_is_seeded_random_access_with_repeats():
  tasks = [f"t{i}" for i in range(5)]
  o = TaskOrder(tasks, seed=3, responses_per_task=2)
  take = lambda order, start, n: [order[i] for i in range(start, start + n)]  # noqa: E731
  seq = take(o, 0, 20)
  assert seq == take(TaskOrder(tasks, seed=3, responses_per_task=2), 0, 20)  # a resumed run draws the same
  assert seq[7:13] == take(o, 7, 6)  # random access: the cursor is the whole state
  assert all(seq[2 * k] == seq[2 * k + 1] for k in range(10))  # k consecutive requests per task
  assert sorted(seq[0:10:2]) == tasks and sorted(seq[10:20:2]) == tasks  # each epoch covers the pool
  assert seq[0:10:2] != seq[10:20:2]  # and is shuffled anew
  assert seq != take(TaskOrder(tasks, seed=4, responses_per_task=2), 0, 20)
  assert derive_seed(1, "a", 2) == derive_seed(1, "a", 2) != derive_seed(1, "a", 3)


def test_check_fresh_refuses_carried_optimizer_state():
  import optax

  from rsi_jax.models.optim import TrainState
  opt = optax.adamw(1e-3)
  p = {"w": jnp.ones(3)}
  fresh = opt.init(p)
  check_fresh(TrainState(p, fresh, None, None, jnp.zeros((), jnp.int32)), "rpr1")
  _, used = opt.update({"w": jnp.ones(3)}, fresh, p)
  with pytest.raises(InvariantError, match="rpr1: actor_opt starts with optimizer state carried"):
    check_fresh(TrainState(p, used, None, None, jnp.zeros((), jnp.int32)), "rpr1")
  with pytest.raises(InvariantError, match="critic_opt"):
    check_fresh(TrainState(p, None, p, used, jnp.zeros((), jnp.int32)), "rpr1")
  with pytest.raises(InvariantError, match="update counter starts at 3"):
    check_fresh(TrainState(p, fresh, None, None, jnp.asarray(3)), "rpr1")


def test_params_digest_sees_every_bit():
  from rsi_jax.models.checkpoint import params_digest
  rng = np.random.default_rng(0)
  p = {"a": jnp.asarray(rng.normal(size=(4, 5)), jnp.float32), "b": jnp.asarray(rng.normal(size=7), jnp.bfloat16)}
  d = params_digest(p)
  assert d == params_digest(jax.tree.map(jnp.copy, p))
  for leaf in ("a", "b"):
    flat = np.asarray(p[leaf]).reshape(-1).copy()
    bits = flat.view(np.uint32 if flat.dtype.itemsize == 4 else np.uint16)
    bits[-1] ^= 1  # the lowest bit of the last element
    q = dict(p, **{leaf: jnp.asarray(bits.view(flat.dtype).reshape(p[leaf].shape))})
    assert params_digest(q) != d
  swapped = {"a": p["a"].T, "b": p["b"]}
  assert params_digest(swapped) != d


def test_metric_logger_truncates_redone_steps_and_plots(tmp_path):
  from rsi_jax.pipeline.metrics import MetricLogger, causal_mean
  assert causal_mean([1, 2, 3, 4, 5, 6, float("nan")]) == [1, 1.5, 2, 2.5, 3, 4, 4.5]
  m = MetricLogger(str(tmp_path), tensorboard=False)
  for i in range(3):
    m.log("rsr1", "rsr", i + 1, {"nll_per_token": 3.0 - i})
  for i in range(4):
    m.log("rpr1", "rpr", i + 1, {"reward_mean": 0.1 * i, "loss": float("nan")})
  m2 = MetricLogger(str(tmp_path), tensorboard=False)  # a resumed run: rpr1 restored after step 2
  m2.truncate(["rsr1", "rpr1"], "rpr1", 2)
  lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [(r["phase"], r["step"]) for r in lines] == [("rsr1", 1), ("rsr1", 2), ("rsr1", 3), ("rpr1", 1), ("rpr1", 2)]
  assert lines[-1]["loss"] is None  # NaN is not JSON
  rec = m2.log("rpr1", "rpr", 3, {"reward_mean": 0.5})
  assert rec["global_step"] == 6
  files = m2.plot()
  assert sorted(Path(f).name for f in files) == ["nll_per_token.png", "reward_mean.png"]
  assert all(Path(f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in files)
  # the same records again (the run's end right after its last phase's): not drawn again; a new record, or a
  # plot file gone, is
  stamps = {f: Path(f).stat().st_mtime_ns for f in files}
  for f in files:
    os.utime(f, ns=(1, 1))
  assert m2.plot() == files and all(Path(f).stat().st_mtime_ns == 1 for f in files)
  m2.log("rpr1", "rpr", 4, {"reward_mean": 0.7})
  assert m2.plot() == files and all(Path(f).stat().st_mtime_ns > 1 for f in files), stamps
  Path(files[0]).unlink()
  assert m2.plot() == files and Path(files[0]).exists()


def test_defaults_cpu_run_fits_the_machine():
  """Plain defaults (configs/base.yml) pass pre-flight on a single device: the fsdp axis is -1."""
  cfg = Config()
  assert cfg.mesh.ici_fsdp_parallelism == -1
  assert preflight(cfg, num_devices=1)


def test_shipped_configs_pass_preflight(tmp_path):
  from rsi_jax.env.learn_tasks import make_suite, write_run_file
  shutil.copytree(CONFIG_DIR, tmp_path / "configs")
  # what learn_check.sh writes: a suite and a run file over configs/learn_check.yml naming its splits
  suite = make_suite(tmp_path / "learn", train_per_template=1, heldout_per_template=1, base_per_template=1)
  run_files = {"learn_check.yml": write_run_file(suite, CONFIG_DIR / "learn_check.yml", tmp_path / "learn" / "run.yml")}
  multi = make_suite(tmp_path / "multi", train_per_template=1, heldout_per_template=1, templates=["multi-step"])
  run_files["learn_check_multi.yml"] = write_run_file(multi, CONFIG_DIR / "learn_check_multi.yml",
                                                      tmp_path / "multi" / "run.yml")
  for f in sorted(CONFIG_DIR.glob("*.yml")):
    ov = [f"run.output_dir={tmp_path}"]
    if load_config(f).model.hf_path:  # a stand-in Base's export, which a fresh clone has not made: a random init
      ov.append("model.hf_path=")  # (tests/rsr/test_corpus_phase.py checks which export each names)
    cfg = load_config(run_files.get(f.name, f), ov)
    plan = preflight(cfg, num_devices=4)
    if f.name == "learn_check_multi.yml":  # every phase on the multi-step suite's train split
      assert {s.name: s.cfg.env.tasks_dir for s in plan} == {
          "rsr1": str(multi["train"]), "critic_seed": str(multi["train"]), "rpr1": str(multi["train"])}
    if f.name == "learn_check.yml":  # Base learns from the base split, the later phases train on the train split
      assert {s.name: s.cfg.env.tasks_dir for s in plan} == {
          "rsr0": str(suite["base"]), "rsr1": str(suite["train"]), "critic_seed": str(suite["train"]),
          "rpr1": str(suite["train"])}
    assert plan


@pytest.mark.slow
def test_training_starts_from_hf_path_or_a_checkpoint(tmp_path):
  """model.hf_path is what a training run starts from (not a random init), and a checkpoint folder given
  as pipeline.actor_from.<phase> is restored onto the mesh."""
  import types

  from rsi_jax.models import Actor, build_mesh
  from rsi_jax.models.checkpoint import save_params
  from rsi_jax.models.hf_import import config_for_hf, load_hf_params
  from rsi_jax.pipeline.driver import Driver
  hf = REPO_ROOT / "tests" / "models" / "fixtures" / "hf_qwen3_tied"
  cfg = config_for_hf(str(hf), _cfg(tmp_path, "mesh.ici_fsdp_parallelism=2", "mesh.ici_tensor_parallelism=1",
                                    "rollout.global_batch=2", "rollout.requested=2"))
  mesh = build_mesh(cfg, jax.devices()[:2])
  ctx = types.SimpleNamespace(actor=Actor(cfg, mesh))
  want = jax.device_get(load_hf_params(str(hf), ctx.actor))
  d = Driver(cfg)
  spec = build_plan(cfg)[0]
  got, src = d._actor_start(ctx, spec, 0, None, {})
  assert src == f"hf:{hf}"
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(jax.device_get(got)), jax.tree.leaves(want)))
  random = jax.device_get(ctx.actor.init(jax.random.key(cfg.run.seed)))
  assert not np.array_equal(jax.tree.leaves(random)[0], jax.tree.leaves(want)[0])
  # a checkpoint folder as the phase's actor source
  ck = save_params(str(tmp_path / "ck"), actor=jax.tree.map(lambda x: x * 2, got))
  spec = build_plan(load_config(SMOKE, [f"pipeline.actor_from.rsr1={ck}"]))[0]
  got2, src2 = d._actor_start(ctx, spec, 0, None, {})
  assert src2 == ck
  assert all(np.array_equal(a, 2 * b) for a, b in zip(jax.tree.leaves(jax.device_get(got2)), jax.tree.leaves(want)))


def test_funnel_tasks_filters_families_then_takes_the_first_of_each_round_robin():
  """rsr.families then rsr.max_tasks: e.g. a warm start on some of the train tasks of some templates."""
  from types import SimpleNamespace

  from rsi_jax.pipeline.rsr_phase import funnel_tasks
  pool = [SimpleNamespace(name=f"{f}-{i}", family=f) for f in ("a", "b", "c") for i in range(4)]
  names = lambda ts: [t.name for t in ts]
  assert names(funnel_tasks(pool, (), 0, "rsr1")) == names(pool)
  assert names(funnel_tasks(pool, ("a", "c"), 0, "rsr1")) == ["a-0", "a-1", "a-2", "a-3", "c-0", "c-1", "c-2", "c-3"]
  assert names(funnel_tasks(pool, ("a", "c"), 5, "rsr1")) == ["a-0", "c-0", "a-1", "c-1", "a-2"]
  assert names(funnel_tasks(pool, (), 3, "rsr1")) == ["a-0", "b-0", "c-0"]
  with pytest.raises(InvariantError, match=r"rsr0: rsr.families names \['z'\]"):
    funnel_tasks(pool, ("a", "z"), 0, "rsr0")
