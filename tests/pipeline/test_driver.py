"""The training program end to end at the smallest size: real MaxText models on an 8-device mesh, the
sampler, Docker tasks with protected verification, Orbax checkpoints, lineage, metrics, TensorBoard, plots."""

import json
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rsi_jax.config import CONFIG_DIR, load_config
from rsi_jax.models import Actor, Critic, build_mesh
from rsi_jax.models.checkpoint import params_digest, restore_params, saved_items
from rsi_jax.pipeline.driver import Driver
from rsi_jax.pipeline.errors import NoTrainableSamples

pytestmark = [pytest.mark.slow, pytest.mark.docker]

PHASES = ["rsr1", "critic_seed", "rpr1", "rsr2", "rpr2"]
TINY = ["run.progress=false", "mesh.ici_fsdp_parallelism=4", "mesh.ici_tensor_parallelism=2",
        "rollout.global_batch=4", "rollout.requested=5", "rollout.max_new_tokens=16", "env.max_turns=1",
        "env.max_tasks=4", "pipeline.sft_epochs=2", "pipeline.rollout_steps=3", "pipeline.critic_only_steps=1",
        "pipeline.checkpoint_every=1", "rl.minibatches=1", "eval.max_tasks=1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, docker_client):
  out = tmp_path_factory.mktemp("run")
  # The critic seed draws from a pool of its own (3 of the run's 4 tasks): a phase's env settings apply to it.
  # env.max_tasks=4 stands as if in the run file: a command-line key=value would win over every phase's.
  ov = [f"run.output_dir={out}", "run.name=t", f"pipeline.phases=[{', '.join(PHASES)}]", *TINY,
        "pipeline.phase_overrides.critic_seed.env.max_tasks=3"]
  cfg = load_config(CONFIG_DIR / "smoke.yml", ov)
  result = Driver(cfg, [o for o in ov if not o.startswith("env.max_tasks=")]).run()
  return cfg, result, out / "t"


def _lineage(run_dir):
  return json.loads((run_dir / "lineage.json").read_text())


def test_lineage_chains_phases_and_carries_the_critic(run):
  cfg, result, run_dir = run
  lineage = _lineage(run_dir)
  assert [e["phase"] for e in lineage] == PHASES
  for before, after in zip(lineage, lineage[1:]):
    assert after["started_from"]["actor"] == before["output"]
  assert lineage[0]["started_from"] == {"actor": "init(seed=0)", "critic": None}
  assert lineage[0]["critic_digest"] is None  # no critic exists before the critic seed
  assert lineage[1]["started_from"]["critic"].startswith("backbone of the phase's starting actor")
  assert lineage[2]["started_from"]["critic"] == lineage[1]["output"]
  # critic seed: actor frozen; RSR-2: critic carried unchanged (Δφ = 0), actor changed
  assert lineage[1]["actor_digest"] == lineage[0]["actor_digest"]
  assert lineage[3]["critic_digest"] == lineage[2]["critic_digest"]
  assert lineage[3]["actor_digest"] != lineage[2]["actor_digest"]
  assert lineage[4]["started_from"]["critic"] == lineage[3]["output"]  # RPR-2 continues the carried critic
  assert lineage[2]["reward"] == "fdr" and lineage[2]["actor_lr"] == 5e-7  # the rpr1 phase file applied
  assert lineage[2]["lr_schedule"] == {"actor": "constant", "critic": "constant"}
  assert lineage[0]["lr_schedule"] == {"actor": "constant"} and lineage[1]["lr_schedule"] == {"critic": "constant"}
  for e in lineage:
    assert len(e["config_digest"]) == 16 and e["code_version"]
    assert (e["reward_table_digest"] is None) == (e["kind"] == "rsr")
  # paths inside the run folder are stored relative to it (a copied or moved run points into itself)
  assert all(e["output"] == f"checkpoints/{e['phase']}/{e['steps']}" for e in lineage)
  assert result["final"] == str(run_dir / lineage[-1]["output"])


def test_checkpoints_hold_params_and_fresh_optimizer_states(run):
  """Every phase step folder holds params, the optimizer states of the trained roles and meta; RPR-1's
  first checkpoint has a critic optimizer that made exactly that step's updates (nothing carried from the
  critic seed) and no actor optimizer (critic-only step)."""
  cfg, _, run_dir = run
  ck = run_dir / "checkpoints"
  assert sorted(p.name for p in (ck / "rpr1").iterdir() if p.name.isdigit()) == ["1", "2", "3"]
  first = ck / "rpr1" / "1"
  assert {p.name for p in first.iterdir()} >= {"actor", "critic", "critic_opt", "meta"}
  assert not (first / "actor_opt").exists()
  assert (ck / "rpr1" / "2" / "actor_opt").is_dir()
  meta = json.loads((first / "meta" / "metadata").read_text())
  assert meta["phase"] == "rpr1" and meta["cursor"] == 5 and meta["update"] == cfg.rl.minibatches
  assert meta["reward_table_digest"] and meta["started_from"]["actor"] == "checkpoints/critic_seed/1"

  def counts(item):
    tree = ocp.StandardCheckpointer().restore(first / item)
    return [int(np.asarray(x)) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
            if "count" in jax.tree_util.keystr(p)]
  assert counts("critic_opt") and set(counts("critic_opt")) == {cfg.rl.minibatches}
  # the RSR checkpoints carry the critic they did not train
  assert saved_items(str(ck / "rsr2" / "2")) == ("actor", "critic")
  assert not (ck / "rsr2" / "2" / "critic_opt").exists()


def test_final_checkpoint_restores_onto_the_mesh(run):
  cfg, _, run_dir = run
  lineage = _lineage(run_dir)
  mesh = build_mesh(cfg)
  actor, critic = Actor(cfg, mesh), Critic(cfg, mesh)
  got = restore_params(str(run_dir / lineage[-1]["output"]), actor=actor.abstract_params, critic=critic.abstract_params)
  assert params_digest(got["critic"]) == lineage[-1]["critic_digest"]
  assert params_digest(got["actor"]) == lineage[-1]["actor_digest"]
  # a phase folder resolves to its newest step
  again = restore_params(str(run_dir / "checkpoints" / "rsr2"), actor=actor.abstract_params)
  assert params_digest(again["actor"]) == lineage[3]["actor_digest"] != lineage[4]["actor_digest"]
  leaf = jax.tree.leaves(got["actor"])[0]
  assert leaf.sharding.mesh.shape == mesh.shape


RPR_FIELDS = ["phase", "step", "reward_mean", "success_mean", "loss", "value/value_loss",
              "value/explained_variance", "value/value_mean", "critic_grad_norm", "mismatch/abs_mean",
              "staleness", "aborted_episodes", "infra_failures", "tokens_per_s", "step_seconds", "turns_mean",
              "skipped_updates", "prefill_tokens", "reused_prompt_tokens", "prompt_reuse"]
JOINT_FIELDS = ["policy/loss", "policy/clip_frac", "policy/clip_frac_low", "policy/clip_frac_high",
                "actor_grad_norm"]


def test_metrics_jsonl_has_every_field(run):
  _, _, run_dir = run
  recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
  # RSR: Q_clean = 4 tasks x 2 harnesses x 1 runbook x 1 execution = 8 trajectories, 2 epochs of batch 4
  assert [(r["phase"], r["step"]) for r in recs] == [
      ("rsr1", 1), ("rsr1", 2), ("rsr1", 3), ("rsr1", 4), ("critic_seed", 1), ("rpr1", 1), ("rpr1", 2),
      ("rpr1", 3), ("rsr2", 1), ("rsr2", 2), ("rsr2", 3), ("rsr2", 4), ("rpr2", 1), ("rpr2", 2), ("rpr2", 3)]
  assert [r["global_step"] for r in recs] == list(range(1, 16))
  rpr = [r for r in recs if r["phase"] == "rpr1"]
  for r in rpr:
    missing = [k for k in RPR_FIELDS + (JOINT_FIELDS if r["train_actor"] else []) if k not in r]
    assert missing == [], missing
    assert r["episodes"] == 4 and r["aborted_episodes"] == 1 and r["episodes_started"] == 5
  assert "actor_grad_norm" not in rpr[0] and rpr[1]["actor_grad_norm"] > 0  # critic-only, then joint
  assert rpr[0]["train_actor"] == 0 and rpr[1]["train_actor"] == 1
  # 5 episodes over 4 tasks (one turn each): episodes of one task, and every task's system prompt, share a
  # prompt prefix whose keys the sampler's prefix cache reuses.
  assert sum(r["reused_prompt_tokens"] for r in rpr) > 0
  assert all(r["prompt_reuse"] == r["reused_prompt_tokens"] / (r["reused_prompt_tokens"] + r["prefill_tokens"])
             for r in rpr if r["prefill_tokens"])
  # the sampler is shared by every phase and evaluation: a phase's first step counts only its own prompt work
  # (steps of 4-5 one-turn episodes; a step may include the next step's episodes started ahead of it)
  for phase in ("rpr1", "rpr2"):
    work = [r["prefill_tokens"] + r["reused_prompt_tokens"] for r in recs if r["phase"] == phase]
    assert 0 < work[0] <= 3 * max(work[1:]), (phase, work)
  sft = [r for r in recs if r["kind"] == "rsr"]
  assert all(r["nll_per_token"] > 0 and r["actor_grad_norm"] > 0 and r["skipped_updates"] == 0 for r in sft)


def test_tensorboard_events_read_back(run):
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  _, _, run_dir = run
  recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
  ea = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
  ea.Reload()
  tags = set(ea.Tags()["scalars"])
  for k in ("reward_mean", "policy/clip_frac", "value/explained_variance", "mismatch/abs_mean", "tokens_per_s"):
    assert f"rpr1/{k}" in tags
  assert "rsr1/nll_per_token" in tags
  ev = ea.Scalars("rpr1/value/explained_variance")
  want = [(r["global_step"], r["value/explained_variance"]) for r in recs if r["phase"] == "rpr1"]
  assert [(e.step, pytest.approx(e.value, abs=1e-6)) for e in ev] == want


def test_plots_are_pngs(run):
  _, result, run_dir = run
  names = sorted(Path(p).name for p in result["plot_files"])
  assert {"reward_mean.png", "success_mean.png", "turns_mean.png", "value_explained_variance.png",
          "mismatch_abs_mean.png", "nll_per_token.png", "advantage_abs_mean.png"} <= set(names)
  for n in names:
    assert (run_dir / "plots" / n).read_bytes()[:4] == b"\x89PNG"


def test_no_container_left(run, docker_client):
  """None of this run's containers (run id ``<run.name>-<hex>``) is left; other runs on the host may have some."""
  from rsi_jax.env.reaper import LABEL_RUN
  cfg, _, _ = run
  left = [c.name for c in docker_client.containers.list(all=True, filters={"label": LABEL_RUN})
          if c.labels.get(LABEL_RUN, "").rsplit("-", 1)[0] == cfg.run.name]
  assert not left


def test_rerun_of_a_finished_run_trains_nothing(run):
  cfg, _, run_dir = run
  before = (run_dir / "metrics.jsonl").read_text()
  r = Driver(cfg, []).run()
  assert r["resumed"] and r["final"] == str(run_dir / _lineage(run_dir)[-1]["output"])
  assert (run_dir / "metrics.jsonl").read_text() == before


def test_a_run_with_nothing_to_train_on_stops_with_the_reason(tmp_path, docker_client):
  """Every prompt rejected by the sampler (its prompt limit, max_cache_length - 1, below the first prompt):
  the run stops naming why, instead of training on an empty batch with a loss of 0."""
  ov = [f"run.output_dir={tmp_path}", "run.name=empty", "pipeline.phases=[critic_seed]", *TINY,
        "env.max_tasks=2", "sampler.max_prefill_length=128", "sampler.prefill_buckets=[128]",
        "sampler.max_cache_length=256"]
  cfg = load_config(CONFIG_DIR / "smoke.yml", ov)
  with pytest.raises(NoTrainableSamples, match=r"critic_seed step 1: none of the 2 episodes has a trainable "
                                               r"generated token .*context_exhausted"):
    Driver(cfg, ov).run()


def _rows(path):
  return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def test_in_training_evaluation_and_the_final_report(run):
  """eval.tasks_dir is set (smoke config): the starting actor and every phase's final weights are evaluated
  with the evaluation code, except weights measured already (the critic seed's frozen actor is RSR-1's);
  the run ends with the stage report over them."""
  cfg, result, run_dir = run
  lineage = _lineage(run_dir)
  stages, seen = [("base", 0)], set()
  for e in lineage:
    if e["actor_digest"] not in seen:
      stages.append((e["phase"], e["steps"]))
    seen.add(e["actor_digest"])
  assert "critic_seed" not in dict(stages) and not (run_dir / "eval" / "critic_seed").exists()
  for phase, step in stages:
    s = json.loads((run_dir / "eval" / phase / str(step) / "summary.json").read_text())
    assert s["n_tasks"] == 1 and s["runs"] == 1 and s["phase"] == phase and s["suite"] == "tasks"
    assert s["sampling"]["temperature"] == 0.6 and s["harness"] == "json"
    assert len((run_dir / "eval" / phase / str(step) / "attempts.jsonl").read_text().splitlines()) == 1
  assert json.loads((run_dir / "eval" / "rpr2" / "3" / "summary.json").read_text())["actor_digest"] == \
      lineage[-1]["actor_digest"]
  recs = _rows(run_dir / "eval" / "metrics.jsonl")
  assert [(r["phase"], r["step"]) for r in recs] == stages
  report = (run_dir / "eval" / "report" / "report.md").read_text()
  assert f"| Suite | {' | '.join(p for p, _ in stages)} |" in report and "| tasks |" in report
  assert result["eval_report"] == str(run_dir / "eval" / "report")
  assert (run_dir / "eval" / "report" / "progression.png").read_bytes()[:4] == b"\x89PNG"
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  ea = EventAccumulator(str(run_dir / "tensorboard"))
  ea.Reload()
  assert len(ea.Scalars("eval/tasks/mean_at_r")) == len(stages)


def test_rsr_phases_train_on_the_funnels_q_clean(run):
  """The smoke plan's RSR phases run the funnel (with the scripted test double, labelled so in the lineage)
  and make exactly the SFT updates Q_clean calls for; the manifest counts what the files hold."""
  cfg, _, run_dir = run
  lineage = {e["phase"]: e for e in _lineage(run_dir)}
  metrics = _rows(run_dir / "metrics.jsonl")
  for ph in ("rsr1", "rsr2"):
    d = run_dir / "phases" / ph
    manifest = json.loads((d / "rsr_manifest.json").read_text())
    q = _rows(d / "q_clean.jsonl")
    st = manifest["stages"]
    assert "test double" in manifest["policy"] and lineage[ph]["rsr"]["policy"] == manifest["policy"]
    assert st["attempted"] == cfg.env.max_tasks * len(cfg.rsr.harnesses) * cfg.rsr.discovery_attempts
    assert st["planned"] == st["discovered"] * cfg.rsr.num_runbooks
    assert st["executed"] == st["reviewed"] * cfg.rsr.num_repeats
    assert st["accepted"] == len(q) == lineage[ph]["rsr"]["q_clean"] > 0
    assert lineage[ph]["rsr"]["stages"] == {k: st[k] for k in lineage[ph]["rsr"]["stages"]}
    b = cfg.rollout.global_batch
    steps = -(-len(q) * cfg.pipeline.sft_epochs // b)
    assert lineage[ph]["steps"] == steps
    rows = [m for m in metrics if m["phase"] == ph]
    assert len(rows) == steps and sum(m["trajectories"] for m in rows) == len(q) * cfg.pipeline.sft_epochs


def test_one_batch_ahead_staleness_is_bounded_and_recorded(run):
  """max_staleness=1 (the default): from the second step on, a step's episodes were collected while the
  previous step trained; after a joint update they were sampled by the weights before it (staleness 1),
  never older; per-token versions split mismatch from drift."""
  cfg, _, run_dir = run
  assert cfg.rollout.max_staleness == 1
  for phase in ("rpr1", "rpr2"):
    rpr = [r for r in _rows(run_dir / "metrics.jsonl") if r["phase"] == phase]
    assert [r["collected_ahead"] for r in rpr] == [0, 1, 1]
    assert all(r["staleness/max"] <= 1 and r["stale_episodes"] == 0 for r in rpr)
    # step 3's episodes ran during step 2's joint update: sampled by the weights before it
    assert rpr[2]["staleness/max"] == 1 and rpr[2]["drift/tokens"] > 0
    assert rpr[2]["weight_version"] == rpr[1]["weight_version"] + 1
    assert rpr[0]["staleness/max"] == rpr[1]["staleness/max"] == 0  # no actor update before them


def test_oversampling_accounting(run):
  _, _, run_dir = run
  recs = [r for r in _rows(run_dir / "metrics.jsonl") if r["kind"] != "rsr"]
  assert all(r["episodes_started"] == r["episodes"] + r["aborted_episodes"] for r in recs)
  # where the used episodes' time went: each step's means are those of its rows in outcomes.jsonl
  for r in recs:
    rows = [o for o in _rows(run_dir / "phases" / r["phase"] / "outcomes.jsonl") if o["step"] == r["step"]]
    assert len(rows) == r["episodes"]
    for k in ("start", "agent", "verify", "total"):
      assert r[f"episode_{k}_seconds"] == pytest.approx(np.mean([o[f"{k}_s"] for o in rows]), abs=1e-3)
    assert all(o["total_s"] >= o["start_s"] + o["agent_s"] + o["verify_s"] > 0 for o in rows)
  assert all(r["aborted_episodes"] == 1 for r in recs if r["kind"] == "rpr")
  seed = [r for r in recs if r["kind"] == "critic_seed"]
  assert all(r["aborted_episodes"] == 0 for r in seed)  # the critic seed runs each task, no oversampling


def test_critic_seed_covers_every_task_once_with_the_actor_frozen(run):
  cfg, _, run_dir = run
  from rsi_jax.env import load_tasks
  from rsi_jax.env.rollouts import pick_tasks
  pool = sorted(t.name for t in pick_tasks(load_tasks(cfg.env.tasks_dir), 3))  # its phase's env.max_tasks
  rows = _rows(run_dir / "phases" / "critic_seed" / "outcomes.jsonl")
  assert sorted(r["task"] for r in rows) == pool
  # the other phases draw from the run's pool of 4: RPR-1's 3 steps of 4 episodes, in seeded epochs over it
  run_pool = {t.name for t in pick_tasks(load_tasks(cfg.env.tasks_dir), cfg.env.max_tasks)}
  assert len(run_pool) == 4 and set(pool) < run_pool
  assert {r["task"] for r in _rows(run_dir / "phases" / "rpr1" / "outcomes.jsonl")} == run_pool
  lineage = _lineage(run_dir)
  assert lineage[1]["actor_digest"] == lineage[0]["actor_digest"]


def test_warmup_is_critic_only_steps_single_updates(run):
  cfg, _, run_dir = run
  for phase in ("rpr1", "rpr2"):
    rpr = [r for r in _rows(run_dir / "metrics.jsonl") if r["phase"] == phase]
    assert [r["train_actor"] for r in rpr] == [0, 1, 1]  # pipeline.critic_only_steps = 1 here
    assert all(r["updates"] == 1 for r in rpr)  # rl.minibatches = ppo_epochs = 1: one update per step


def test_reward_tables_calibrated_before_the_critic_seed_carried_to_rpr1_recalibrated_before_rpr2(run):
  """FDR divisors come from RSR-1's discovery reports (Eq. 6) before the critic seed; RPR-1 keeps that table,
  so the critic is seeded and trained on one reward scale; SPR recalibrates it before RPR-2."""
  import numpy as np
  from rsi_jax.rl.divisors import load_divisor_table
  cfg, _, run_dir = run
  lineage = {e["phase"]: e for e in _lineage(run_dir)}
  t0 = load_divisor_table(run_dir / "phases" / "critic_seed" / "divisor_table.json")
  t1 = load_divisor_table(run_dir / "phases" / "rpr1" / "divisor_table.json")
  t2 = load_divisor_table(run_dir / "phases" / "rpr2" / "divisor_table.json")
  assert lineage["rpr1"]["reward_table_digest"] == t1.digest == t0.digest and t1.kind == "fdr"
  assert lineage["rpr2"]["reward_table_digest"] == t2.digest and t2.kind == "spr"
  assert "rsr1" in t0.source and t2.parent == t1.digest and "rpr1" in t2.source
  found = [r for r in _rows(run_dir / "phases" / "rsr1" / "outcomes.jsonl") if r["valid"]]
  assert found and t0.families
  for fam in {r["family"] for r in found}:  # Eq. 6: the 0.9 quantile of the family's check counts
    totals = [r["total"] for r in found if r["family"] == fam]
    assert t0.divisor(fam) == pytest.approx(float(np.quantile(totals, cfg.reward.calibration_quantile)))
  # the rewards the critic seed and RPR-1 logged are FDR under that one table
  for phase in ("critic_seed", "rpr1"):
    rows = [r for r in _rows(run_dir / "phases" / phase / "outcomes.jsonl") if r["valid"]]
    assert rows
    for r in rows:
      assert r["reward"] == pytest.approx(r["passed"] / t1.divisor(r["family"]), rel=1e-5)
