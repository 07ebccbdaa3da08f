"""``rsr.policy: corpus``: an RSR phase whose Q_clean is the stand-in Base's generated corpus (no tasks, no funnel),
rendered as the target harness's first turn, trained on by the real training program."""

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest

from rsi_jax.config import CONFIG_DIR, ConfigError, load_config
from rsi_jax.env import base_corpus as bc
from rsi_jax.env.harness import make_harness
from rsi_jax.models import ChatRenderer
from rsi_jax.env.pool import AllEndpointsDown
from rsi_jax.pipeline.driver import Driver
from rsi_jax.pipeline.plan import phase_config
from rsi_jax.rl.batch import load_samples
from rsi_jax.rsr.control import Step, render_steps
from rsi_jax.rsr.funnel import planning_prompt
from rsi_jax.rsr.runbook import load_template, write_runbook
from rsi_jax.rsr.shellwords import commands as shell_commands, sections

PAIRS, PROCEDURES, RUNBOOKS = 40, 8, 4
OV = ["run.progress=false", "mesh.ici_fsdp_parallelism=4", "mesh.ici_tensor_parallelism=2",
      "rollout.global_batch=8", "rollout.requested=8", "pipeline.phases=[rsr0]", "pipeline.sft_epochs=1",
      "pipeline.checkpoint_every=2", "eval.tasks_dir=", "rsr.policy=corpus", f"rsr.corpus_pairs={PAIRS}",
      f"rsr.corpus_procedures={PROCEDURES}", f"rsr.corpus_runbooks={RUNBOOKS}", "env.max_turns=3"]


def test_the_corpus_is_set_only_with_its_policy():
  with pytest.raises(ConfigError, match=r"rsr.corpus_pairs: must be > 0 with policy corpus .* got 0 with policy "
                                        r"'corpus'"):
    load_config(CONFIG_DIR / "smoke.yml", ["rsr.policy=corpus"])
  with pytest.raises(ConfigError, match=r"rsr.corpus_pairs: .* got 8 with policy 'scripted'"):
    load_config(CONFIG_DIR / "smoke.yml", ["rsr.corpus_pairs=8"])
  with pytest.raises(ConfigError, match=r"rsr.policy: must be actor/scripted/corpus, got 'corpora'"):
    load_config(CONFIG_DIR / "smoke.yml", ["rsr.policy=corpora", "rsr.corpus_pairs=8"])
  with pytest.raises(ConfigError, match=r"rsr.corpus_procedures: must be >= 0, and 0 unless policy is corpus, got 4 "
                                        r"with policy 'scripted'"):
    load_config(CONFIG_DIR / "smoke.yml", ["rsr.corpus_procedures=4"])
  with pytest.raises(ConfigError, match=r"rsr.corpus_procedures: needs env.max_turns >= 3 .* got env.max_turns 1"):
    load_config(CONFIG_DIR / "stand_in_base.yml", ["rsr.corpus_procedures=4"])
  with pytest.raises(ConfigError, match=r"rsr.corpus_runbooks: must be >= 0, and 0 unless policy is corpus, got 2 "
                                        r"with policy 'scripted'"):
    load_config(CONFIG_DIR / "smoke.yml", ["rsr.corpus_runbooks=2"])


@pytest.mark.slow
def test_a_corpus_phase_trains_on_the_corpus_as_the_harness_renders_it(tmp_path, tokenizer):
  """...with no Docker: a plan that runs no episode contacts no endpoint (this one names a socket that does not
  exist, an endpoint of its own: no client another test opened stands in; a run that needs episodes says "no
  Docker endpoint answers")."""
  ov = [f"run.output_dir={tmp_path}", "run.name=c", *OV, f"env.docker_hosts=[unix://{tmp_path}/no-docker.sock]"]
  cfg = load_config(CONFIG_DIR / "smoke.yml", ov)
  Driver(cfg, ov).run()
  d = tmp_path / "c" / "phases" / "rsr0"
  manifest = json.loads((d / "rsr_manifest.json").read_text())
  records = [json.loads(x) for x in (d / "q_clean.jsonl").read_text().splitlines()]
  lineage = {e["phase"]: e for e in json.loads((tmp_path / "c" / "lineage.json").read_text())}["rsr0"]
  assert manifest["policy"].startswith("the stand-in pre-training corpus")
  assert f"{PAIRS} pairs, {PROCEDURES} procedures, {RUNBOOKS} runbooks" in manifest["policy"]
  total = PAIRS + PROCEDURES + 2 * RUNBOOKS  # a runbook task is two samples: planning, then the guided execution
  assert lineage["rsr"]["policy"] == manifest["policy"] and lineage["rsr"]["q_clean"] == total
  assert manifest["stages"]["accepted"] == total and manifest["stages"]["attempted"] == 0
  assert manifest["tasks"] == 0 and set(manifest["templates"]) == {"plan", "exec"}
  # the label names the corpus's content: a stored Q_clean of the corpus before its shapes changed is not reused
  seed, digest = re.search(r", seed (\d+), corpus ([0-9a-f]{12})$", manifest["policy"]).groups()
  seed = int(seed)
  assert digest == bc.corpus_digest()
  seen, unseen = bc.value_pools(tokenizer)
  rb_tasks = bc.runbook_tasks(RUNBOOKS, seed, seen, procedures=True)
  assert [r["shape"] for r in records] == ([bc.SHAPES[k % len(bc.SHAPES)].name for k in range(PAIRS)]
                                           + [bc.PROCEDURES[k % len(bc.PROCEDURES)].name for k in range(PROCEDURES)]
                                           + [name for name, *_ in rb_tasks for _ in range(2)])
  assert [r.get("stage") for r in records[PAIRS + PROCEDURES:]] == ["planning", "guided"] * RUNBOOKS
  assert lineage["steps"] == total // cfg.rollout.global_batch

  # each sample is the target harness's first turn: its prompt (system prompt + instruction), the command as reply
  want = bc.pairs(PAIRS, seed, seen)
  harness = make_harness("json", object(), ChatRenderer(tokenizer), env_cfg=cfg.env)
  samples = load_samples(d / "q_clean.npz")
  assert len(samples) == total
  for (instruction, command), (s,) in zip(want, samples[:PAIRS]):
    gen = np.asarray(s.gen_mask) > 0
    prompt = harness.prompt_for(instruction)
    assert list(s.ids[:len(prompt)]) == prompt and not gen[:len(prompt)].any()
    # env.max_turns 3: the whole episode, the command then done (test_a_pair_is_the_episode_the_harness_records)
    assert tokenizer.decode(list(s.ids[gen])) == bc.reply(command) + "<|im_end|>" + bc.done_reply() + "<|im_end|>"
  assert not {w for _, c in want for w in c.replace("/", " ").split()} & set(unseen)
  # the procedures: the harness's own loop (prompt, reply, observation, reply, ..., done)
  for (instruction, outputs, commands), (s,) in zip(bc.procedures(PROCEDURES, seed, seen),
                                                    samples[PAIRS:PAIRS + PROCEDURES]):
    prompt = harness.prompt_for(instruction)
    assert list(s.ids[:len(prompt)]) == prompt
    text = tokenizer.decode(list(s.ids[len(prompt):]))
    assert json.dumps(outputs[commands[0]])[1:-1] in text  # the first command's output, as its observation
    assert tokenizer.decode(list(s.ids[np.asarray(s.gen_mask) > 0])) == "<|im_end|>".join(
        [bc.reply(c) for c in commands] + [bc.done_reply()]) + "<|im_end|>"
  # the runbook tasks: the planning call as the funnel makes it (I_plan over the instruction and the commands with
  # their exit status and output) -> a runbook whose steps are those commands, as the scripted planner writes
  # one; then the execution with that runbook as private guidance (I_exec) in place of the instruction
  renderer = ChatRenderer(tokenizer)
  plan_t, exec_t = load_template(cfg.rsr.plan_template), load_template(cfg.rsr.exec_template)
  for (name, instruction, outputs, commands), (plan,), (guided,) in zip(
      rb_tasks, samples[PAIRS + PROCEDURES::2], samples[PAIRS + PROCEDURES + 1::2]):
    text = tokenizer.decode(list(plan.ids))
    assert text.startswith("<|im_start|>user\nYou write runbooks") and instruction in text
    for c in commands:
      assert f"$ {c}\n[exit 0]\n" + outputs.get(c, "") in text, (name, c)
    gen = np.asarray(plan.gen_mask) > 0
    runbook = tokenizer.decode(list(plan.ids[gen])).removesuffix("<|im_end|>")
    assert runbook == write_runbook(instruction, commands, "/app").strip()
    assert list(plan.ids[~gen]) == planning_prompt(plan_t, instruction, render_steps(
        [Step(c, 0, False, outputs.get(c, "")) for c in commands]), renderer)
    assert [c for c in shell_commands(sections(runbook)["Steps"])] == commands  # what a follower reads as its steps
    guide = make_harness("json", object(), renderer, env_cfg=cfg.env,
                         guidance=lambda t: exec_t.render(instruction=t.instruction, runbook=runbook))
    prompt = guide.initial_prompt(SimpleNamespace(instruction=instruction))
    assert list(guided.ids[:len(prompt)]) == prompt and "Private guidance:" in tokenizer.decode(prompt)
    replies = [bc.reply(c) for c in commands] + [bc.done_reply()]
    assert tokenizer.decode(list(guided.ids[np.asarray(guided.gen_mask) > 0])) == "<|im_end|>".join(
        replies) + "<|im_end|>"
  # scripts/base_corpus_check.py measures this phase's checkpoint, runbooks too: exact match of each measure
  # (values in [0, 1]; the tiny smoke model trained for a few updates is not expected to score)
  import os
  import subprocess
  import sys
  from rsi_jax.config import REPO_ROOT
  p = subprocess.run([sys.executable, "scripts/base_corpus_check.py", "--prompt", "harness", "--eval", "2",
                      "--by-shape", "0", "--runbooks", "3", "--multi-turn", "2",
                      "--config", "configs/learn_check_multi.yml", f"--checkpoint={tmp_path}/c/checkpoints/rsr0",
                      "model_name=qwen3-tiny"], cwd=REPO_ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                     capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stderr[-3000:]
  for kind in ("written", "followed"):
    assert re.search(rf"^runbooks {kind} \(3 tasks over unseen values\): [01]\.\d{{3}}$", p.stdout, re.M), p.stdout
  # a procedure's second command and done after it, done after a pair's command: 2 episodes of each
  for kind in ("procedures, the act from the output", "procedures, done after it", "pairs, done after the command"):
    assert re.search(rf"^multi-turn: {kind} \(2 over unseen values\): [01]\.\d{{3}}$", p.stdout, re.M), p.stdout


@pytest.mark.parametrize("max_turns", [1, 2])
def test_a_pair_is_the_episode_the_harness_records(tokenizer, max_turns):
  """A corpus pair (and a runbook task's single-command execution) is what the target harness records of an
  episode that issues the command: under one turn the command's turn alone; under more, the command, its
  (empty) observation, then ``done`` -- a Base for a multi-turn check must learn to stop, not only to act."""
  from rsi_jax.rsr.corpus import corpus_funnel
  cfg = load_config(CONFIG_DIR / "stand_in_base.yml", ["rsr.corpus_pairs=6", "rsr.corpus_runbooks=2",
                                                       f"env.max_turns={max_turns}"])
  renderer = ChatRenderer(tokenizer)
  result = corpus_funnel(cfg, tokenizer, renderer, seed=3)
  seen, _ = bc.value_pools(tokenizer)
  harness = make_harness("json", object(), renderer, env_cfg=cfg.env)
  assert len(result.episodes) == 6 + 2 * 2
  for (instruction, command), (s,) in zip(bc.pairs(6, 3, seen), result.episodes[:6]):
    prompt = harness.prompt_for(instruction)
    assert list(s.ids[:len(prompt)]) == prompt
    gen = np.asarray(s.gen_mask) > 0
    want = [bc.reply(command)] + ([bc.done_reply()] if max_turns > 1 else [])
    assert tokenizer.decode(list(s.ids[gen])) == "<|im_end|>".join(want) + "<|im_end|>"
    if max_turns > 1:  # the observation between the two replies, which the model reads and is not trained on
      after = tokenizer.decode(list(s.ids[len(prompt):]))
      assert after.startswith(bc.reply(command) + "<|im_end|>") and "<|im_start|>user" in after
  tasks = bc.runbook_tasks(2, 3, seen)
  for (_, _, _, commands), (guided,) in zip(tasks, result.episodes[7::2]):
    want = [bc.reply(c) for c in commands] + ([bc.done_reply()] if max_turns > 1 else [])
    assert tokenizer.decode(list(guided.ids[np.asarray(guided.gen_mask) > 0])) == "<|im_end|>".join(
        want) + "<|im_end|>"


def test_the_stand_in_base_is_trained_on_the_learning_checks_own_first_turn(tokenizer):
  """configs/stand_in_base.yml renders the corpus with the same system prompt as configs/learn_check.yml's
  episodes (a Base trained on another prompt would meet the check's prompt for the first time)."""
  base, check = (load_config(CONFIG_DIR / f) for f in ("stand_in_base.yml", "learn_check.yml"))
  assert base.rsr.policy == "corpus" and base.pipeline.phases == ("rsr0", "rsr1", "rsr2")
  assert base.pipeline.sft_epochs == 1
  # every phase on the corpus, each with pairs of its own (its seed); rsr0 and rsr1 differ only in the rate's
  # course: warmup and hold in rsr0, a cosine decay over rsr1's updates, to the update the corpus's pairs give;
  # rsr2 adds the runbook format (runbook tasks among fewer pairs), warmed up and decayed over its own updates
  assert set(base.pipeline.phase_overrides) == {"rsr1", "rsr2"}
  assert set(base.pipeline.phase_overrides["rsr1"]) == {"actor_optim"}
  rsr0, rsr1, rsr2 = (phase_config(base, ph) for ph in ("rsr0", "rsr1", "rsr2"))
  assert rsr0.rsr == rsr1.rsr == base.rsr and base.rsr.corpus_runbooks == 0
  assert (rsr0.actor_optim.schedule, rsr0.actor_optim.warmup_steps) == ("constant", 50)
  assert rsr1.actor_optim.schedule == "cosine" and rsr1.actor_optim.warmup_steps == 0
  updates = lambda r: -(-(r.corpus_pairs + 2 * r.corpus_runbooks) * base.pipeline.sft_epochs  # noqa: E731
                        // base.rollout.global_batch)
  assert rsr1.actor_optim.decay_steps == updates(base.rsr) == 1500
  assert rsr2.rsr.corpus_runbooks > 0 and rsr2.actor_optim.schedule == "cosine"
  assert rsr2.actor_optim.decay_steps == updates(rsr2.rsr) == 375
  assert base.rsr.target_harness == check.env.harness == "json"
  prompt = lambda c: make_harness("json", object(), ChatRenderer(tokenizer), env_cfg=c.env).system_prompt()  # noqa: E731
  assert prompt(base) == prompt(check)
  assert base.actor_optim.weight_decay == check.actor_optim.weight_decay == 0


def test_the_multi_step_base_is_trained_under_the_multi_step_checks_harness(tokenizer):
  """configs/stand_in_base_multi.yml trains the one-command stand-in Base on (its export, model.hf_path) under
  configs/learn_check_multi.yml's harness: the same system prompt (four turns), the model, whole episodes (the
  pairs end with done: more than one turn), procedures and runbooks, one decay over the phase's updates."""
  base, one, check = (load_config(CONFIG_DIR / f) for f in ("stand_in_base_multi.yml", "stand_in_base.yml",
                                                             "learn_check_multi.yml"))
  assert base.model.hf_path == f"{one.run.output_dir}/{one.run.name}/hf" and base.run.name != one.run.name
  assert base.model.base_num_decoder_layers == one.model.base_num_decoder_layers == check.model.base_num_decoder_layers
  assert base.model.base_emb_dim == check.model.base_emb_dim
  assert base.pipeline.phases == ("rsr0",) and not base.pipeline.phase_overrides and base.pipeline.sft_epochs == 1
  r = base.rsr
  assert r.policy == "corpus" and min(r.corpus_pairs, r.corpus_procedures, r.corpus_runbooks) > 0
  assert base.actor_optim.schedule == "cosine" and base.actor_optim.decay_steps == -(
      -(r.corpus_pairs + r.corpus_procedures + 2 * r.corpus_runbooks) // base.rollout.global_batch) == 500
  assert check.env.max_turns == base.env.max_turns == 4 and r.target_harness == check.env.harness == "json"
  assert check.model.hf_path == f"{base.run.output_dir}/{base.run.name}/hf" and "rsr0" not in check.pipeline.phases
  prompt = lambda c: make_harness("json", object(), ChatRenderer(tokenizer), env_cfg=c.env).system_prompt()  # noqa: E731
  assert prompt(base) == prompt(check) != prompt(one)
  assert base.actor_optim.weight_decay == check.actor_optim.weight_decay == 0
  assert (base.rl.pad_multiple, base.rl.per_device_token_budget) == (one.rl.pad_multiple, 0)


@pytest.mark.slow
def test_a_plan_that_runs_episodes_still_needs_docker(tmp_path):
  """The same corpus phase with an in-training evaluation runs episodes: without a Docker endpoint the run stops
  at once, naming it."""
  ov = [f"run.output_dir={tmp_path}", "run.name=e", *OV, "eval.tasks_dir=tasks", "eval.max_tasks=1",
        f"env.docker_hosts=[unix://{tmp_path}/no-docker.sock]"]
  with pytest.raises(AllEndpointsDown, match="no Docker endpoint answers"):
    Driver(load_config(CONFIG_DIR / "smoke.yml", ov), ov).run()


@pytest.mark.slow
def test_resuming_with_another_optimizer_form_names_the_config_as_the_cause(tmp_path):
  """A phase resumed under run.allow_config_change with a warmup it did not have (the optimizer state then holds a
  schedule's count, which none of the phase's checkpoints hold): every step is refused as before, nothing is
  changed, and the error says that the optimizer settings' change is the cause, naming it. The phase is made
  unfinished as a kill would leave it: its checkpoints kept, its lineage entry not yet written."""
  from rsi_jax.pipeline.plan import PreflightError
  ov = [f"run.output_dir={tmp_path}", "run.name=o", *[o for o in OV if not o.startswith(("rsr.corpus_", "env.max_turns"))],
        "rsr.corpus_pairs=16",
        "env.docker_hosts=[unix:///nonexistent.sock]"]
  Driver(load_config(CONFIG_DIR / "smoke.yml", ov), ov).run()
  run = tmp_path / "o"
  (run / "lineage.json").write_text("[]")
  steps = sorted(p.name for p in (run / "checkpoints" / "rsr0").iterdir())
  ov2 = [*ov, "actor_optim.warmup_steps=2", "run.allow_config_change=true"]
  with pytest.raises(PreflightError) as e:
    Driver(load_config(CONFIG_DIR / "smoke.yml", ov2), ov2).run()
  msg = str(e.value)
  assert msg.startswith("rsr0: no intact checkpoint in ") and "item 'actor_opt'" in msg, msg
  assert "The cause is the config, not the checkpoints" in msg and "actor_optim.warmup_steps: 0 -> 2" in msg, msg
  assert sorted(p.name for p in (run / "checkpoints" / "rsr0").iterdir()) == steps  # nothing set aside
