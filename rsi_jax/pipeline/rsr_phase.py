"""The RSR phase: Recursive Self-Rewrite's funnel builds Q_clean, then actor-only SFT on it."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import jax
from etils import epath

from rsi_jax.env.rollouts import derive_seed, pick_tasks
from rsi_jax.models.optim import init_train_state, make_optimizer, make_train_step, masked_nll_loss
from rsi_jax.pipeline import multihost
from rsi_jax.pipeline.errors import InvariantError
from rsi_jax.pipeline.metrics import read_jsonl
from rsi_jax.pipeline.phases import Phase
from rsi_jax.pipeline.rpr import sft_passes
from rsi_jax.rl.batch import Sample, assemble_batch, load_samples
from rsi_jax.rl.metrics import combine_pass_metrics


class RSRPhase(Phase):
  """Recursive Self-Rewrite: the funnel of :mod:`rsi_jax.rsr` (discovery under ``rsr.harnesses``, runbook
  planning, review, fresh execution under H₀, leakage screen, projection) builds Q_clean, then actor-only SFT
  (Eq. 3, masked to generated tokens): ``pipeline.sft_epochs`` passes over Q_clean sampled uniformly
  (grain, multiplicities kept), ``rollout.global_batch`` trajectories per update. An empty Q_clean ends the
  phase with the actor unchanged. The funnel's output is stored in the phase folder, so a resumed phase
  trains on the same data."""
  kind = "rsr"
  trains_actor = True

  def __init__(self, *a, **kw):
    super().__init__(*a, **kw)
    self.opt = make_optimizer(self.cfg.actor_optim)
    nll = masked_nll_loss(self.ctx.actor)
    self._step = make_train_step(self.ctx.actor, self.opt, nll)
    self.samples: list[list[Sample]] = []
    self._it = None

  def setup(self, actor_params, step=0):
    from rsi_jax.models.checkpoint import params_digest
    from rsi_jax.rsr.funnel import QClean, funnel_table
    # the actor the phase (and its funnel) started from: on resume, not the mid-phase actor it continues with
    self.input_digest = self.actor_start_digest or params_digest(actor_params)
    # the first process reads what an earlier attempt stored or runs the funnel; every process trains on it
    got = multihost.from_primary(self._stored, step)
    if got is None:
      if self.cfg.rsr.policy == "actor":
        self.ctx.serve(actor_params)  # on every process (the weight sync is collective)
      got = multihost.from_primary(self._funnel)
    records, self.samples, self.manifest, self.stored = got
    if len(self.samples) != len(records):
      raise InvariantError(f"{self.name}: Q_clean holds {len(self.samples)} trajectories but its records "
                           f"{len(records)} ({self.workdir})")
    self.qclean = QClean(records)
    self.table = funnel_table(self.manifest)
    if not self.samples:
      self.num_steps = 0
      return
    b = self.cfg.rollout.global_batch
    self.num_steps = len(self.qclean.batches(0, self.cfg.pipeline.sft_epochs, b))

  def _stored(self, step: int):
    """(records, Q_clean, manifest, note) an earlier attempt of this phase stored for these weights, else
    None."""
    from rsi_jax.env.tasks import tasks_digest
    from rsi_jax.rsr.funnel import MANIFEST
    wd = epath.Path(self.workdir)
    stored = json.loads((wd / MANIFEST).read_text()) if (wd / MANIFEST).exists() else None
    if stored is not None and step == 0 and (stored.get("input_actor_digest") != self.input_digest
                                             or stored.get("tasks_digest") != tasks_digest(self.funnel_tasks())
                                             or (self.cfg.rsr.policy == "corpus"
                                                 and stored.get("policy") != self._corpus_label())):
      return None  # the phase starts anew from other weights or on other tasks: its funnel runs again
    if step > 0 and (stored is None or (self.actor_start_digest is not None
                                        and stored.get("input_actor_digest") != self.input_digest)):
      # the checkpoint's data-loader state indexes the Q_clean it trained on: another one cannot stand in
      raise InvariantError(f"{self.name}: its checkpoint at step {step} trained on the Q_clean of {wd}, which "
                           + ("is missing" if stored is None else
                              f"now holds a funnel of another actor ({stored.get('input_actor_digest')}, not "
                              f"{self.input_digest})")
                           + f": restore that folder, or remove the phase's checkpoints to run it anew")
    if stored is None:
      return None
    records = read_jsonl(wd / "q_clean.jsonl")
    return records, (load_samples(wd / "q_clean.npz") if records else []), stored, \
        " (stored by an earlier attempt)"

  def _funnel(self):
    """Run the funnel (the actor already served): (records, Q_clean, manifest, note)."""
    from rsi_jax.rsr.corpus import corpus_funnel
    from rsi_jax.rsr.funnel import policy_factory, run_funnel
    from rsi_jax.rsr.scripted import LABEL, ScriptedRSRPolicy
    cfg, ctx = self.cfg, self.ctx
    if cfg.rsr.policy == "corpus":
      res = corpus_funnel(cfg, ctx.tokenizer, ctx.renderer, seed=self._corpus_seed(), workdir=self.workdir,
                          input_digest=self.input_digest)
      return res.records, res.episodes, res.manifest, ""
    tasks = self.funnel_tasks()
    abort = threading.Event()  # a stop notice aborts the funnel's episodes and planning calls
    if cfg.rsr.policy == "scripted":
      scripted = ScriptedRSRPolicy(ctx.tokenizer, tasks)
      policy_for, label = (lambda tag: scripted), LABEL
    else:
      policy_for = policy_factory(ctx.sampler, derive_seed(cfg.run.seed, "rsr", self.name),
                                  cfg.rollout.deterministic, abort)
      label = "the actor"
    res = run_funnel(cfg, tasks, ctx.pool, ctx.renderer, policy_for, label=label, workdir=self.workdir,
                     input_digest=self.input_digest, stop=ctx.stop,
                     abort=abort)
    return res.records, res.episodes, res.manifest, ""

  def _corpus_seed(self) -> int:
    return derive_seed(self.cfg.run.seed, "corpus", self.name)

  def _corpus_label(self) -> str:
    from rsi_jax.rsr.corpus import corpus_label
    return corpus_label(self.cfg.rsr, self._corpus_seed())

  def funnel_tasks(self) -> list:
    if self.cfg.rsr.policy == "corpus":
      return []  # the corpus is generated: no task of the pool
    return funnel_tasks(self.ctx.tasks_for(self.cfg), self.cfg.rsr.families, self.cfg.rsr.max_tasks, self.name)

  def describe(self):
    m = self.manifest
    source = m["policy"] if self.cfg.rsr.policy == "corpus" else f"RSR funnel run by {m['policy']}"
    head = f"Q_clean {len(self.samples)} trajectories, {source}{self.stored}"
    if not self.samples:
      return f"{head}; empty ({m['empty_reason']}): the phase ends with the actor unchanged"
    return (f"{head}; {self.cfg.pipeline.sft_epochs} epoch(s), {self.num_steps} update(s), actor LR "
            f"{self.cfg.actor_optim.learning_rate:g}, critic carried unchanged")

  def report(self):
    return self.table

  def lineage_extra(self):
    st = self.manifest["stages"]
    return {"rsr": {"policy": self.manifest["policy"], "q_clean": len(self.samples),
                    "input_actor_digest": self.input_digest,
                    "stages": {k: st[k] for k in ("attempted", "discovered", "planned", "reviewed", "executed",
                                                  "verified", "leak_screened", "accepted")},
                    "templates": {k: v["digest"] for k, v in self.manifest["templates"].items()},
                    "manifest": str(epath.Path(self.workdir) / "rsr_manifest.json")}}

  def optimizers(self):
    return {"actor_opt": self.opt}

  def init_state(self, actor_params, critic_params):
    return init_train_state(self.ctx.actor, self.opt, actor_params)

  def step(self, state, i):
    t0 = time.time()
    b = self.cfg.rollout.global_batch
    if self._it is None:  # Q_clean's grain iterator, at the position the (resumed) state records
      self._it = iter(self.qclean.batches(state.seed, self.cfg.pipeline.sft_epochs, b).to_iter_dataset())
      self._it.set_state(state.data if state.data is not None else {"next_index": i})
    idx = [int(k) for k in next(self._it)]
    state = dataclasses.replace(state, data=self._it.get_state())
    eps = [self.samples[k] for k in idx]
    batch = assemble_batch(eps, [1.0] * len(eps), pad_multiple=self.cfg.rl.pad_multiple,
                           pad_id=self.ctx.tokenizer.pad_id)
    # packed passes (rl.per_device_token_budget), gradients accumulated into one update; the loss divides by
    # the update's trajectory segments, so it equals the unpacked one
    plan, passes = sft_passes(self.cfg, self.ctx.mesh, batch)
    train, _, aux = self._step.accumulate(state.train, passes, combine=combine_pass_metrics)
    aux = jax.device_get(aux)
    tokens = int(batch.gen_mask.sum())
    dt = time.time() - t0
    m = {"loss": float(aux["nll_per_token"]), "nll_per_token": float(aux["nll_per_token"]),
         "actor_grad_norm": float(aux["actor_grad_norm"]), "skipped_updates": int(aux["skipped"]),
         "trajectories": len(eps), "sft_tokens": tokens, "tokens_per_s": tokens / max(dt, 1e-9),
         "step_seconds": dt, **plan.stats()}
    return dataclasses.replace(state, train=train), m


def funnel_tasks(pool, families, max_tasks: int, phase: str) -> list:
  """The tasks an RSR phase's funnel runs on: those of ``families`` (every family when empty; a family the pool
  lacks is an error), then at most ``max_tasks`` of them (0 = all), the first of each family round-robin."""
  unknown = sorted(set(families) - {t.family for t in pool})
  if unknown:
    raise InvariantError(f"{phase}: rsr.families names {unknown}, which no task of the pool has (its "
                         f"families: {sorted({t.family for t in pool})})")
  return pick_tasks([t for t in pool if not families or t.family in families], max_tasks)
