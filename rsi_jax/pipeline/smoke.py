"""The phase plan end to end at smoke size (``python -m rsi_jax.train --config=configs/smoke.yml``).

Base ─RSR-1─► θ1 ─critic seed─► φ_seed ─RPR-1─► (θ1⁺, φ1⁺) ─RSR-2─► θ2 (Δφ = 0) ─RPR-2─► final

Every part is the real one: the MaxText Qwen3 actor and critic on a mesh, the continuous-batching sampler,
Docker sandboxes running the shipped tasks with protected verification, FDR / SPR rewards, TB-GAE + PPO, and
Orbax param checkpoints with a lineage record. What is reduced at smoke size:

* RSR discovery: a random-init actor verifies nothing, so discovery replays each task's reference solution
  through the target JSON harness (a scripted policy, token-in/token-out records) and keeps the episodes the
  protected verifier passes; the rewrite/review stages of §2.1 are not run here. The actor is then
  fine-tuned on those records (Eq. 3, masked to generated tokens) and the critic is untouched (checked).
* Batch, steps and turns come from ``configs/smoke.yml`` (a few episodes, a couple of rollout steps).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import json
import time
import uuid
from pathlib import Path

import jax
import numpy as np
from absl import logging

from rsi_jax.config import Config, dump_config, load_phase_overlay, with_overrides
from rsi_jax.log import progress
from rsi_jax.policy import SamplingParams

RSR_PHASES = ("rsr1", "rsr2")


@dataclasses.dataclass
class Summary:
  """What the run did, one line per fact, plus whether every check held."""
  lines: list = dataclasses.field(default_factory=list)
  ok: bool = True
  run_id: str = ""  # the label value on every container of the run (rsi_jax.run)

  def add(self, key: str, value, ok: bool = True):
    self.lines.append((key, str(value), ok))
    self.ok &= ok
    logging.info("%s: %s%s", key, value, "" if ok else "  <-- FAILED")

  def render(self) -> str:
    w = max(len(k) for k, *_ in self.lines) if self.lines else 0
    out = ["", "== rsi_jax smoke run " + ("OK" if self.ok else "FAILED") + " =="]
    out += [f"{k:<{w}}  {v}{'' if ok else '   <-- FAILED'}" for k, v, ok in self.lines]
    return "\n".join(out)


def params_digest(params) -> str:
  """A content hash of a param tree (for lineage and the Δφ = 0 check across RSR phases)."""
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(jax.device_get(params)):
    a = np.asarray(leaf)
    h.update(str(a.shape).encode() + str(a.dtype).encode())
    h.update(a.tobytes())
  return h.hexdigest()[:16]


class Rollouts:
  """Episodes for one rollout step: ``requested`` submitted, the first ``global_batch`` to finish used."""

  def __init__(self, pool, tasks, harness_factory):
    self.pool, self.tasks, self.harness_factory = pool, tasks, harness_factory

  def collect(self, requested: int, used: int, offset: int = 0):
    jobs = [self.tasks[(offset + i) % len(self.tasks)] for i in range(requested)]
    futs = [self.pool.submit(t, self.harness_factory) for t in jobs]
    got = []
    for f in cf.as_completed(futs):
      got.append(f.result())
      if len(got) == used:
        break
    for f in futs:  # the rest: not started ones are dropped, running ones finish and are discarded
      f.cancel()
    return got


def run_smoke(cfg: Config) -> Summary:
  # Heavy imports here: the config has been validated before anything is built.
  from rsi_jax.env import EnvPool, JsonHarness, ScriptedPolicy, load_tasks, make_harness
  from rsi_jax.env.harness import oracle_commands
  from rsi_jax.models import Actor, ChatRenderer, Critic, build_mesh, load_tokenizer
  from rsi_jax.models.checkpoint import save_params
  from rsi_jax.models.optim import init_train_state, make_optimizer, make_train_step, masked_nll_loss
  from rsi_jax.pipeline.rpr import RPRTrainer
  from rsi_jax.rl.batch import assemble_batch, episode_samples
  from rsi_jax.rl.divisors import divisor_table_from_config
  from rsi_jax.rl.rewards import outcome_rewards
  from rsi_jax.sampler.server import SamplerServer

  t_start = time.time()
  run_id = f"{cfg.run.name}-{uuid.uuid4().hex[:6]}"
  s = Summary(run_id=run_id)
  run_dir = Path(cfg.run.output_dir) / cfg.run.name
  ckpt_root = Path(cfg.pipeline.checkpoint_dir or run_dir / "checkpoints").absolute()
  run_dir.mkdir(parents=True, exist_ok=True)
  (run_dir / "config.yml").write_text(dump_config(cfg))

  # --- models on a mesh
  mesh = build_mesh(cfg)
  actor, critic = Actor(cfg, mesh), Critic(cfg, mesh)
  key = jax.random.key(cfg.run.seed)
  actor_params = actor.init(jax.random.fold_in(key, 0))
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(actor_params))
  axes = {k: v for k, v in mesh.shape.items() if v > 1} or {"(single device)": 1}
  s.add("mesh", f"{axes} over {mesh.devices.size} {jax.devices()[0].platform} device(s)")
  s.add("actor", f"MaxText Qwen3 '{cfg.model.name}', {n_params:,} params, "
        f"{cfg.model.base_num_decoder_layers} layers, emb {cfg.model.base_emb_dim}")
  tok = load_tokenizer(cfg.model.tokenizer_path)
  renderer = ChatRenderer(tok)

  # --- one sharded forward of both roles on a rendered prompt
  probe = renderer.render([{"role": "user", "content": "echo hello"}], add_generation_prompt=True).ids
  toks = np.asarray(probe, np.int32)[None]
  pos = np.arange(toks.shape[1], dtype=np.int32)[None]
  seg = np.ones_like(toks)
  critic_params = critic.init_from_actor(actor_params, jax.random.fold_in(key, 1))
  lp = np.asarray(actor.token_logprobs(actor_params, toks, pos, seg))
  v = np.asarray(critic.values(critic_params, toks, pos, seg))
  s.add("sharded forward", f"{toks.shape[1]} tokens: mean logprob {lp[0, 1:].mean():.3f}, "
        f"mean value {v[0, 1:].mean():.4f}", ok=bool(np.isfinite(lp).all() and np.isfinite(v).all()))
  critic_params = None  # the critic is seeded from the RSR-1 actor, as in the paper

  # --- environments
  tasks = _pick_tasks(load_tasks(cfg.env.tasks_dir), cfg.rollout.requested)
  s.add("tasks", f"{len(tasks)} from {cfg.env.tasks_dir}: " + ", ".join(t.name for t in tasks))
  pool = EnvPool.from_config(cfg.env, run_id, hygiene_patterns=cfg.reward.hygiene_patterns)
  oracle = pool.run([(tasks[0], make_harness("oracle"))])[0]
  s.add("container round trip", f"oracle on {oracle.task}: state {oracle.outcome.state.value}, "
        f"S={oracle.success}, P/N={oracle.outcome.passed}/{oracle.outcome.total}, {oracle.total_s:.1f}s",
        ok=oracle.success == 1)

  sampler = SamplerServer.from_config(cfg, actor_params, tokenizer=tok)
  sampling = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                            top_k=cfg.rollout.top_k, max_new_tokens=cfg.rollout.max_new_tokens)
  rollouts = Rollouts(pool, tasks, lambda: make_harness(cfg.env.harness, sampler, renderer, sampling,
                                                        env_cfg=cfg.env))
  lineage = []
  prev = {"actor": f"init(seed={cfg.run.seed})", "critic": None}
  offset = 0
  try:
    for phase in cfg.pipeline.phases:
      pcfg = with_overrides(cfg, load_phase_overlay(phase))
      t0 = time.time()
      entry = {"phase": phase, "started_from": dict(prev), "reward": pcfg.reward.kind,
               "actor_lr": pcfg.actor_optim.learning_rate, "critic_lr": pcfg.critic_optim.learning_rate}
      if phase in RSR_PHASES:
        critic_before = params_digest(critic_params) if critic_params is not None else None
        accepted = _discover(pool, tasks, tok, renderer, pcfg, JsonHarness, ScriptedPolicy, oracle_commands)
        samples = [episode_samples(r.segments, i) for i, r in enumerate(accepted)]
        batch = assemble_batch(samples, [1.0] * len(samples), pad_multiple=pcfg.rl.pad_multiple,
                               pad_id=tok.pad_id, num_rows=_round_rows(sum(map(len, samples)), mesh))
        opt = make_optimizer(pcfg.actor_optim)
        nll = masked_nll_loss(actor)
        step = make_train_step(actor, opt, nll)
        sft_eval = jax.jit(lambda a, d: nll(a, None, d)[1]["nll_per_token"])
        state = init_train_state(actor, opt, actor_params)
        data = {"tokens": batch.tokens, "positions": batch.positions, "segment_ids": batch.segment_ids,
                "mask": batch.gen_mask}
        losses = []  # per-token NLL before each update; the last entry is after the final one
        for _ in progress(range(pcfg.pipeline.sft_epochs), f"{phase} SFT", enabled=cfg.run.progress):
          state, _, aux = step(state, data)
          losses.append(float(aux["nll_per_token"]))
        losses.append(float(sft_eval(state.actor, data)))
        actor_params = state.actor
        sampler.update_weights(actor_params)
        entry.update(accepted=len(accepted), sft_tokens=int(batch.gen_mask.sum()), sft_losses=losses)
        s.add(f"{phase}", f"{len(accepted)} verified trajectories, {int(batch.gen_mask.sum())} generated tokens, "
              f"{pcfg.pipeline.sft_epochs} SFT epoch(s) (Eq. 3), NLL/token {losses[0]:.3f} -> {losses[-1]:.3f}",
              ok=len(accepted) > 0 and losses[-1] < losses[0])
        if critic_before is not None:
          same = params_digest(critic_params) == critic_before
          s.add(f"{phase} critic carried", f"digest {critic_before} unchanged (Δφ = 0)", ok=same)
      else:
        if critic_params is None:
          critic_params = critic.init_from_actor(actor_params, jax.random.fold_in(key, 2))
          entry["started_from"]["critic"] = "backbone from the current actor + fresh value head"
        trainer = RPRTrainer(pcfg, actor, critic)
        table = divisor_table_from_config(pcfg.reward)
        n_steps = 1 if phase == "critic_seed" else pcfg.pipeline.rollout_steps
        critic_only = n_steps if phase == "critic_seed" else pcfg.pipeline.critic_only_steps
        state = trainer.init_state(actor_params, critic_params, train_actor=critic_only == 0)
        history = []
        for i in progress(range(n_steps), phase, enabled=cfg.run.progress):
          eps = rollouts.collect(pcfg.rollout.requested, pcfg.rollout.global_batch, offset)
          offset += pcfg.rollout.requested
          rewards, mask = outcome_rewards([e.outcome for e in eps], [e.family for e in eps],
                                          pcfg.reward.kind, table)
          batch = assemble_batch([episode_samples(e.segments, j) for j, e in enumerate(eps)], rewards,
                                 mask > 0, pad_multiple=pcfg.rl.pad_multiple, pad_id=tok.pad_id,
                                 num_rows=_round_rows(sum(len(e.segments) for e in eps), mesh,
                                                      pcfg.rl.minibatches))
          train_actor = i >= critic_only
          if train_actor and state.actor_opt is None:
            state = trainer.start_actor(state)
          state, m = trainer.step(state, batch, train_actor)
          if train_actor:
            sampler.update_weights(state.actor)
          infra = int((mask == 0).sum())
          history.append({"step": i, "train_actor": train_actor, "reward_mean": float(rewards[mask > 0].mean())
                          if mask.any() else None, "infra_failures": infra, "loss": m["loss"],
                          "value_loss": m.get("value/value_loss", m.get("value/loss")),
                          "policy_loss": m.get("policy/loss"), "mismatch": m["mismatch/abs_mean"],
                          "turns": int(sum(len(e.turns) for e in eps))})
          if (i + 1) % pcfg.pipeline.checkpoint_every == 0 or i + 1 == n_steps:
            save_params(str(ckpt_root / phase / f"step_{i + 1}"), actor=state.actor, critic=state.critic,
                        force=True)
        actor_params, critic_params = state.actor, state.critic
        last = history[-1]
        entry.update(steps=history)
        s.add(f"{phase}", f"{n_steps} rollout step(s) ({critic_only} critic-only), reward {pcfg.reward.kind} "
              f"mean {last['reward_mean']}, loss {last['loss']:.4f}, infra failures {last['infra_failures']}, "
              f"train/sampler logprob gap {last['mismatch']:.2e}",
              ok=all(np.isfinite(h["loss"]) for h in history))
      out = ckpt_root / phase / "final"
      save_params(str(out), actor=actor_params, critic=critic_params, force=True)
      entry.update(output=str(out), actor_digest=params_digest(actor_params),
                   critic_digest=params_digest(critic_params) if critic_params is not None else None,
                   seconds=round(time.time() - t0, 1), weight_version=sampler.weight_version)
      lineage.append(entry)
      prev = {"actor": str(out), "critic": str(out) if critic_params is not None else None}
      (run_dir / "lineage.json").write_text(json.dumps(lineage, indent=1, default=_json_default))
  finally:
    sampler.close()
    pool.close()
  s.add("checkpoints", f"{ckpt_root} (Orbax, items actor/critic per phase), lineage {run_dir / 'lineage.json'}")
  counts = dict(pool.counts)
  s.add("episodes", f"{counts.pop('episodes', 0)} run, {counts.pop('infra_failures', 0)} infrastructure "
        f"failures (masked) {counts or ''}")
  s.add("wall time", f"{time.time() - t_start:.0f}s")
  return s


def _discover(pool, tasks, tok, renderer, pcfg, JsonHarness, ScriptedPolicy, oracle_commands):
  """RSR discovery at smoke size: reference solutions replayed as JSON actions, kept when verified."""
  def harness_for(task):
    cmd = oracle_commands(task)
    policy = ScriptedPolicy(tok, [json.dumps({"command": cmd, "done": False}), '{"done": true}'])
    return JsonHarness(policy, renderer, SamplingParams(max_new_tokens=4096), max_turns=3,
                       command_timeout_s=pcfg.env.command_timeout_s,
                       output_cap_bytes=pcfg.env.output_cap_bytes)

  results = pool.run([(t, harness_for(t)) for t in tasks])
  return [r for r in results if r.success == 1 and r.segments]


def _pick_tasks(tasks, n):
  """Up to n tasks, round-robin over families so every family is represented."""
  by_family: dict[str, list] = {}
  for t in tasks:
    by_family.setdefault(t.family, []).append(t)
  out, i = [], 0
  while len(out) < min(n, len(tasks)):
    for fam in sorted(by_family):
      if i < len(by_family[fam]) and len(out) < n:
        out.append(by_family[fam][i])
    i += 1
  return out


def _round_rows(rows: int, mesh, minibatches: int = 1) -> int:
  """Rows padded so every minibatch splits evenly over the mesh's batch shards (data x fsdp)."""
  unit = int(mesh.shape.get("data", 1)) * int(mesh.shape.get("fsdp", 1)) * minibatches
  return -(-rows // unit) * unit


def _json_default(x):
  if isinstance(x, (np.floating, np.integer)):
    return x.item()
  return str(x)
