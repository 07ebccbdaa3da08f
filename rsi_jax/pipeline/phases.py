"""The phase kinds of the plan, each a small part the driver calls (:mod:`rsi_jax.pipeline.driver`).

A phase owns what one of its steps is; the driver owns the order of phases, where their weights come from,
checkpoints, resume, metrics and the console. The interface (:class:`Phase`):

* ``setup(actor_params)`` — anything the phase needs before its first step (RSR: its SFT data), idempotent
  across a resume (it may read what an interrupted attempt stored under ``workdir``);
* ``num_steps`` — how many steps the phase runs (known after ``setup``);
* ``init_state(actor, critic)`` — a :class:`~rsi_jax.models.optim.TrainState` with **fresh** optimizer
  states (phases hand over weights only, paper App. A);
* ``optimizers()`` — the optax chains of the roles it trains (restore targets);
* ``step(state, i)`` — step ``i``: returns ``(state, metrics)``; ``state`` also carries the rollout cursor.

Kinds: :class:`RSRPhase` (actor-only SFT on verified trajectories, Eq. 3; the critic is not given to it and
the driver checks it comes out unchanged), :class:`CriticSeedPhase` (critic-only updates on rollouts of the
frozen actor) and :class:`RPRPhase` (``pipeline.critic_only_steps`` critic-only steps, then joint PPO).
RSR runs the funnel of :mod:`rsi_jax.rsr` in ``setup`` and trains on what it accepts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time

import jax
import numpy as np
from etils import epath

from rsi_jax.config import Config
from rsi_jax.env.rollouts import RolloutPolicy, TaskOrder, collect, derive_seed, pick_tasks
from rsi_jax.models.optim import TrainState, init_train_state, make_optimizer, make_train_step, masked_nll_loss
from rsi_jax.pipeline import multihost
from rsi_jax.pipeline.errors import InvariantError, NoTrainableSamples  # noqa: F401 (importers name them here)
from rsi_jax.pipeline.rpr import sft_passes
from rsi_jax.pipeline.metrics import read_jsonl
from rsi_jax.pipeline.scoring import score_and_filter
from rsi_jax.policy import SamplingParams
from rsi_jax.rl.batch import Sample, assemble_batch, load_samples
from rsi_jax.rl.metrics import combine_pass_metrics
from rsi_jax.rl.outcome_table import EPISODE_TIMES, outcome_row
from rsi_jax.stop import StopRequested, wait_all


@dataclasses.dataclass
class RunContext:
  """What every phase of a run shares: models on the mesh, tokenizer, environments, sampler."""
  cfg: Config
  mesh: object
  actor: object  # rsi_jax.models.Actor
  critic: object  # rsi_jax.models.Critic
  tokenizer: object
  renderer: object
  pool: object  # rsi_jax.env.EnvPool
  pools: dict  # (env.tasks_dir, env.max_tasks) -> tasks: every phase's task pool
  run_dir: str
  sampler: object = None  # rsi_jax.sampler.server.SamplerServer, created with the first weights it serves
  actor_version: int = 0  # the sampler's version number of the weights last handed to it
  eval_suite: tuple | None = None  # (tasks, frozen strata) of eval.tasks_dir, loaded at the first evaluation
  # the driver's stop notice (``.requested``, ``.signal_name``) where long waits end early on it (None: none);
  # on several processes they leave a step together at its next exchange (multihost.gather_or_stop)
  stop: object = None
  _served: object = None  # the weights last handed to the sampler

  def tasks_for(self, cfg) -> list:
    """The task pool of a phase whose config is ``cfg`` (a phase may set its own env.tasks_dir / max_tasks)."""
    return self.pools[pool_key(cfg)]

  def serve(self, actor_params, wait: bool = True):
    """Hand ``actor_params`` to the sampler (creating it on first use) as a new weight version; ``wait``:
    until it serves them (else requests in flight finish on the old weights first: swap_policy)."""
    if self.sampler is not None and actor_params is self._served:
      return  # these very weights are being served already (no new version: staleness stays exact)
    self._served = actor_params
    if self.sampler is None:
      from rsi_jax.sampler.server import SamplerServer
      self.sampler = SamplerServer.from_config(self.cfg, actor_params, tokenizer=self.tokenizer)
      self.actor_version = self.sampler.weight_version
    else:
      self.actor_version = self.sampler.update_weights(actor_params)
      if wait:
        self.sampler.wait_swapped()


@dataclasses.dataclass
class PhaseState:
  train: TrainState
  seed: int  # the phase's RNG seed (task order, SFT order, per-request sampling seeds)
  cursor: int = 0  # rollout requests made so far in this phase (the data order's position)
  data: dict | None = None  # a data iterator's state (RSR: Q_clean's grain iterator), checkpointed with it


class Phase:
  kind = ""
  trains_actor = False
  uses_critic = False  # False: the critic is carried past the phase untouched (checked by the driver)

  def __init__(self, name: str, cfg: Config, ctx: RunContext, workdir: str, earlier: tuple = ()):
    self.name, self.cfg, self.ctx, self.workdir = name, cfg, ctx, workdir
    self.earlier = tuple(earlier)  # (name, kind, workdir) of the phases before this one in the plan
    self.num_steps = 0
    # digest of the actor the phase started from (set by the driver; a resumed phase's comes from its checkpoint)
    self.actor_start_digest: str | None = None

  def setup(self, actor_params, step: int = 0) -> None:
    """Before the first step to run (``step`` > 0: resuming after that step)."""

  def close(self) -> None:
    """Stop whatever the phase still has running (the driver calls it when the phase ends or fails)."""

  def flush(self) -> None:
    """Wait until what the phase writes off the step's path (transcripts) is on storage: the driver calls it
    before each checkpoint, so a resumed run has every checkpointed step's files."""

  def optimizers(self) -> dict:
    raise NotImplementedError

  def init_state(self, actor_params, critic_params) -> TrainState:
    raise NotImplementedError

  def step(self, state: PhaseState, i: int) -> tuple[PhaseState, dict]:
    raise NotImplementedError

  def describe(self) -> str:
    return f"{self.num_steps} steps"

  def reward_digest(self) -> str | None:
    return None

  def report(self) -> str:
    """Lines for the console after ``setup`` (RSR: the funnel table)."""
    return ""

  def lineage_extra(self) -> dict:
    """What the phase adds to its lineage entry."""
    return {}


# ------------------------------------------------------------------------------------------------ RSR


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
      if self.cfg.rsr.policy != "scripted":
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
                                             or stored.get("tasks_digest") != tasks_digest(self.funnel_tasks())):
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
    from rsi_jax.rsr.funnel import policy_factory, run_funnel
    from rsi_jax.rsr.scripted import LABEL, ScriptedRSRPolicy
    cfg, ctx = self.cfg, self.ctx
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

  def funnel_tasks(self) -> list:
    return funnel_tasks(self.ctx.tasks_for(self.cfg), self.cfg.rsr.families, self.cfg.rsr.max_tasks, self.name)

  def describe(self):
    m = self.manifest
    head = f"Q_clean {len(self.samples)} trajectories, RSR funnel run by {m['policy']}{self.stored}"
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


# ------------------------------------------------------------------------------------------ rollouts


TB_EPISODES = 3  # episodes of each rollout step shown as TensorBoard text


class RolloutPhase(Phase):
  """Phases that learn from episodes of the current actor (critic seed, RPR): one rollout step per phase
  step, then the PPO / value updates of :class:`~rsi_jax.pipeline.rpr.RPRTrainer`."""
  uses_critic = True

  def __init__(self, *a, **kw):
    super().__init__(*a, **kw)
    from rsi_jax.pipeline.rpr import RPRTrainer
    self.trainer = RPRTrainer(self.cfg, self.ctx.actor, self.ctx.critic)
    self.table = None  # set by setup: frozen for the phase
    self.outcomes = epath.Path(self.workdir) / "outcomes.jsonl"
    from rsi_jax.env.transcripts import TranscriptWriter
    self.transcripts = TranscriptWriter(epath.Path(self.workdir) / "episodes")
    r = self.cfg.rollout
    self.sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                                   max_new_tokens=r.max_new_tokens)

  def reward_digest(self):
    return self.table.digest

  def optimizers(self):
    return {"actor_opt": self.trainer.actor_opt, "critic_opt": self.trainer.critic_opt}

  def critic_only(self, i: int) -> bool:
    raise NotImplementedError

  def init_state(self, actor_params, critic_params):
    return self.trainer.init_state(actor_params, critic_params, train_actor=not self.critic_only(0))

  def _setup_rollouts(self, actor_params, step):
    self.ctx.serve(actor_params)
    self.table = multihost.from_primary(self._records, step)

  def _records(self, step):
    """The first process's part of the setup: the phase's reward table, and the outcome records of the steps
    about to be redone dropped (resuming)."""
    table = self._reward_table()
    self.transcripts.remove_after(step)  # the steps about to be redone write theirs again
    if self.outcomes.exists():
      rows = read_jsonl(self.outcomes)
      self.outcomes.write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] <= step))
    return table

  def _reward_table(self):
    """The phase's divisor table (App. B), frozen for the phase and stored in its folder (a resumed phase
    reads it back): ``reward.divisor_table`` when set; else, for FDR, the table of the plan's latest earlier
    rollout phase (the critic seed's, for RPR-1: the critic keeps the reward scale it was seeded on); else
    FDR divisors calibrated (Eq. 6, quantile ``reward.calibration_quantile``) from the verifier reports of
    the plan's earlier phases (RSR discovery episodes included: N is a property of a task's tests, not of who
    attempted it); for SPR, the previous RPR phase's table recalibrated from its outcomes, or the FDR
    calibration where there is none; else the fallback divisor for every family."""
    from rsi_jax.rl.divisors import (DivisorTable, calibrate_fdr_divisors, divisor_table_from_config,
                                     load_divisor_table, recalibrate_spr_divisors)
    from rsi_jax.rl.outcome_table import OutcomeTable
    r = self.cfg.reward
    path = epath.Path(self.workdir) / "divisor_table.json"
    if path.exists():
      table = load_divisor_table(str(path))
    elif r.divisor_table:
      table = divisor_table_from_config(r)
    else:
      rollout_dirs = [(n, k, epath.Path(d)) for n, k, d in self.earlier if k in ("critic_seed", "rpr")]
      rows = lambda d: read_jsonl(d / "outcomes.jsonl") if (d / "outcomes.jsonl").exists() else []  # noqa: E731
      prev_rpr = [(n, d) for n, k, d in rollout_dirs if k == "rpr" and (d / "divisor_table.json").exists()]
      prev_fdr = [(n, d) for n, _, d in rollout_dirs if (d / "divisor_table.json").exists()
                  and load_divisor_table(str(d / "divisor_table.json")).kind == "fdr"]
      if r.kind == "fdr" and prev_fdr:
        table = load_divisor_table(str(prev_fdr[-1][1] / "divisor_table.json"))
      elif r.kind == "spr" and prev_rpr:
        n, d = prev_rpr[-1]
        table = recalibrate_spr_divisors(load_divisor_table(str(d / "divisor_table.json")),
                                         OutcomeTable.from_rows(rows(d), str(d / "outcomes.jsonl")), r,
                                         source=f"recalibrated from {n}'s outcomes", phase=self.name)
      else:
        sources = [(n, epath.Path(d)) for n, k, d in self.earlier if k in ("rsr", "critic_seed", "rpr")]
        sources = [(n, d) for n, d in sources if rows(d)]
        history = OutcomeTable.from_rows([x for _, d in sources for x in rows(d)], "earlier episodes")
        if len(history):
          table = calibrate_fdr_divisors(history, quantile=r.calibration_quantile,
                                         fallback_divisor=r.fallback_divisor, phase=self.name,
                                         source=f"calibrated from the verifier reports of "
                                                f"{', '.join(n for n, _ in sources)}")
          if r.kind == "spr":  # an SPR phase with no earlier RPR phase: the FDR calibration seeds it
            table = DivisorTable(table.families, table.fallback_divisor, "spr", self.name, table.source,
                                 table.created, table.digest, table.settings, table.notes)
        else:
          table = divisor_table_from_config(r)
    if table.kind != r.kind:
      raise ValueError(f"{self.name}: divisor table {table.digest} is for {table.kind!r} rewards but "
                       f"reward.kind is {r.kind!r}")
    if not path.exists():
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(json.dumps(table.to_dict(), indent=2) + "\n")
    return table

  def requests(self, state: PhaseState, i: int) -> tuple[list[int], int]:
    """(request indices of step ``i``, how many of their episodes are used): ``rollout.requested`` from the
    cursor, ``rollout.global_batch`` used (oversampling)."""
    r = self.cfg.rollout
    return list(range(state.cursor, state.cursor + r.requested)), r.global_batch

  def _start(self, state: PhaseState, i: int):
    """Start this process's share of step ``i``'s episodes (:func:`~rsi_jax.pipeline.multihost.process_share`:
    all of them in a single process); returns (a future of (episodes, aborted, started, seconds), the
    episodes' abort switches). ``started`` counts every process's requests."""
    from rsi_jax.env import make_harness
    order = TaskOrder(self.ctx.tasks_for(self.cfg), state.seed, self.cfg.rollout.responses_per_task)
    idx, used = self.requests(state, i)
    started = len(idx)
    idx = [idx[j] for j in multihost.process_share(len(idx))]
    used = len(multihost.process_share(used))
    det = self.cfg.rollout.deterministic
    jobs = []
    for k in idx:
      ev = threading.Event()
      policy = RolloutPolicy(self.ctx.sampler, ev, derive_seed(state.seed, "rollout", i, k) if det else None)
      jobs.append((order[k], make_harness(self.cfg.env.harness, policy, self.ctx.renderer, self.sampling,
                                          env_cfg=self.cfg.env), ev))

    def run():
      t0 = time.time()
      eps, aborted = collect(self.ctx.pool, jobs, used, deterministic=det)
      return eps, aborted, started, time.time() - t0

    return self._executor.submit(run), [ev for _, _, ev in jobs]

  def _keep_transcripts(self, state, i: int, eps, rewards, ok, targets):
    """Queue step ``i``'s transcripts (``run.keep_transcripts`` picks the episodes, a sample drawn from the
    step's seed) as ``episodes/<step>.jsonl.gz``."""
    from rsi_jax.env.transcripts import select
    keep = select(eps, self.cfg.run.keep_transcripts, derive_seed(state.seed, "transcripts", i))
    trained = [bool(k) for k in ok]
    cfg, tasks, table = self.cfg, self.ctx.tasks_for(self.cfg), self.table
    shown = set(select(keep, f"sample:{TB_EPISODES}", derive_seed(state.seed, "tensorboard", i)))

    def build():
      recs = _transcripts(cfg, tasks, table, eps, rewards, trained, targets, keep)
      self._tensorboard_text(i + 1, [r for k, r in enumerate(recs) if k in shown])
      return recs
    self.transcripts.write(i + 1, build=build)

  def _tensorboard_text(self, step: int, recs: list[dict]):
    """A few of the step's episodes as TensorBoard text (``<run>/tensorboard/episodes``, tag
    ``<phase>/episodes``, at the phase's step), for readers who stay in TensorBoard."""
    from rsi_jax.env.transcripts import text_summary
    if not recs:
      return
    if getattr(self, "_tb", None) is None:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(str(epath.Path(self.ctx.run_dir) / "tensorboard" / "episodes"), flush_secs=10)
    self._tb.add_text(f"{self.name}/episodes", "\n\n---\n\n".join(text_summary(r) for r in recs), step)
    self._tb.flush()

  def _sampler_delta(self) -> dict:
    """The samplers' prompt work since the previous step, summed over every process's sampler: tokens
    prefilled, tokens whose keys came from the prefix cache (the episode's earlier turns) and the reused share."""
    now, prev = self._sampler_counts(), self._sampler_prev
    self._sampler_prev = now
    total = multihost.sum_counts({"prefill_tokens": now[0] - prev[0], "reused_prompt_tokens": now[1] - prev[1]})
    pre, reused = total["prefill_tokens"], total["reused_prompt_tokens"]
    return {**total, "prompt_reuse": reused / (pre + reused) if pre + reused else 0.0}

  def setup(self, actor_params, step=0):
    import concurrent.futures as cf
    self._executor = cf.ThreadPoolExecutor(1, thread_name_prefix=f"{self.name}-rollouts")
    self._ahead = None  # (step, future): the next step's rollouts, started before this step's update
    self._setup_rollouts(actor_params, step)
    self._sampler_prev = self._sampler_counts()  # the sampler is shared: earlier phases' and evaluations' work

  def _sampler_counts(self) -> tuple[int, int]:
    st = getattr(self.ctx.sampler, "stats", None)
    return (st.prefill_tokens, st.reused_tokens) if st is not None else (0, 0)

  def flush(self):
    self.transcripts.flush()

  def close(self):
    try:
      self.transcripts.close()  # what the steps queued is written, also when the phase stops early
      if getattr(self, "_tb", None) is not None:
        self._tb.close()
        self._tb = None
    finally:
      self._close_rollouts()

  def _close_rollouts(self):
    if getattr(self, "_ahead", None) is not None:  # stopped early (preemption, an error): abort the next step's
      _, fut, events = self._ahead
      for ev in events:
        ev.set()
      fut.result()  # every episode has ended and removed its container
      self._ahead = None
    if getattr(self, "_executor", None) is not None:
      self._executor.shutdown(wait=True)

  def step(self, state, i):
    """Collect the step's episodes (and start the next step's ahead), score and filter them, train, serve
    the new actor weights, report the step's metrics."""
    cfg, ctx = self.cfg, self.ctx
    t0 = time.time()
    state, eps, aborted, started, t_roll, ahead = self._collect(state, i)
    version = ctx.actor_version  # the weights being trained now
    s = score_and_filter(eps, self.table, cfg.reward.kind, version, cfg.rollout.max_staleness,
                         pad_multiple=cfg.rl.pad_multiple, pad_id=ctx.tokenizer.pad_id,
                         where=f"{self.name} step {i + 1}")
    if multihost.is_primary():  # for the reward tables of later phases (calibration, App. B)
      with self.outcomes.open("a") as f:
        for e, rew in zip(eps, s.rewards):
          f.write(json.dumps(outcome_row(i + 1, e, rew)) + "\n")
    train_actor = not self.critic_only(i)
    train = state.train
    if train_actor and train.actor_opt is None:
      train = self.trainer.start_actor(train)  # fresh AdamW state for the actor after the critic-only steps
    t1 = time.time()
    train, m = self.trainer.step(train, s.batch, train_actor, version=version)
    if multihost.is_primary():  # built and written on the writer's thread, off the step's path
      self._keep_transcripts(state, i, eps, s.rewards, s.ok, self.trainer.last_targets)
    if train_actor:
      ctx.serve(train.actor, wait=self._ahead is None)  # async: in-flight episodes finish on the old weights
    t_train = time.time() - t1
    gen_tokens = sum(e.generated_tokens for e in eps)
    m.update(  # reward and success over the episodes trained on (scored and fresh enough)
        train_actor=int(train_actor), reward_mean=_mean(s.rewards[s.ok]), success_mean=_mean(
            [float(e.success or 0) for e, k in zip(eps, s.ok) if k]),
        turns_mean=_mean([len(e.turns) for e in eps]), episodes=len(eps), episodes_started=started,
        aborted_episodes=aborted, infra_failures=int((s.mask == 0).sum()), stale_episodes=int(s.too_old.sum()),
        trainable_episodes=len(s.trainable), collected_ahead=int(ahead),
        prompt_rejected=sum(e.stop_reason == "context_exhausted" for e in eps),
        generated_tokens=gen_tokens, tokens_per_s=gen_tokens / max(t_roll, 1e-9),
        weight_version=version, rollout_seconds=t_roll, train_seconds=t_train,
        **{f"episode_{k[:-2]}_seconds": _mean([getattr(e, k) for e in eps]) for k in EPISODE_TIMES},
        rollout_wait_seconds=t1 - t0, step_seconds=time.time() - t0, **self._sampler_delta())
    m["staleness"] = m["staleness/max"]
    return dataclasses.replace(state, train=train), m

  def _collect(self, state, i: int):
    """Step ``i``'s episodes from every process, in process order (= request order: the same batch on every
    process), started ahead during the previous step or now; the cursor moved past them; and the next step's
    batch started ahead (§3.1: its episodes run on the current weights while this step trains). Returns
    (state, episodes, aborted, started, rollout seconds, collected ahead)."""
    if self._ahead is not None and self._ahead[0] == i:
      (_, fut, events), ahead = self._ahead, True
      self._ahead = None
    else:
      (fut, events), ahead = self._start(state, i), False
    try:  # a stop notice aborts the episodes; every process leaves the step together at the exchange below
      (eps, aborted, started, t_roll), = wait_all([fut], self.ctx.stop, events)
      stopped = None
    except StopRequested as e:  # gather_or_stop raises it again once every process is there
      eps, aborted, started, t_roll, stopped = [], 0, 0, 0.0, e.args[0]
    eps, aborted = multihost.gather_or_stop(eps, stopped), sum(multihost.gather_objects([aborted]))
    state = dataclasses.replace(state, cursor=state.cursor + started)
    if self.cfg.rollout.max_staleness > 0 and i + 1 < self.num_steps:
      self._ahead = (i + 1, *self._start(state, i + 1))
    return state, eps, aborted, started, t_roll, ahead


def _transcripts(cfg, tasks, table, eps, rewards, trained, targets, keep) -> list[dict]:
  """The records of a rollout step's kept episodes (``keep``: their indices), with each turn's critic value and
  TB-GAE advantage from the step's ``targets``."""
  from rsi_jax.env.transcripts import boundary_values, episode_record
  vals = boundary_values(eps, targets["old_values"], targets["advantages"], trained)
  by_name = {t.name: t for t in tasks}
  out = []
  for j in keep:
    e = eps[j]
    task = by_name.get(e.task)
    out.append(episode_record(e, index=j, reward=float(rewards[j]), divisor=float(table.divisor(e.family)),
                              values=vals[j], instruction=task.instruction if task is not None else None,
                              output_cap_bytes=cfg.env.output_cap_bytes))
  return out


def pool_key(cfg) -> tuple:
  """Which task pool a (phase) config draws from."""
  return cfg.env.tasks_dir, cfg.env.max_tasks


def funnel_tasks(pool, families, max_tasks: int, phase: str) -> list:
  """The tasks an RSR phase's funnel runs on: those of ``families`` (every family when empty; a family the pool
  lacks is an error), then at most ``max_tasks`` of them (0 = all), the first of each family round-robin."""
  unknown = sorted(set(families) - {t.family for t in pool})
  if unknown:
    raise InvariantError(f"{phase}: rsr.families names {unknown}, which no task of the pool has (its "
                         f"families: {sorted({t.family for t in pool})})")
  return pick_tasks([t for t in pool if not families or t.family in families], max_tasks)


class CriticSeedPhase(RolloutPhase):
  """φ_seed: critic-only updates on rollouts of the frozen actor, ``pipeline.critic_seed_epochs`` full
  passes over the task pool: every task ``responses_per_task`` times per epoch, ``rollout.global_batch``
  episodes per step (the last step of the phase may be smaller), no oversampling."""
  kind = "critic_seed"

  def setup(self, actor_params, step=0):
    p, r = self.cfg.pipeline, self.cfg.rollout
    self.total = p.critic_seed_epochs * len(self.ctx.tasks_for(self.cfg)) * r.responses_per_task
    self.num_steps = math.ceil(self.total / r.global_batch)
    super().setup(actor_params, step)

  def requests(self, state, i):
    b = self.cfg.rollout.global_batch
    idx = list(range(i * b, min((i + 1) * b, self.total)))
    return idx, len(idx)

  def critic_only(self, i):
    return True

  def describe(self):
    return (f"{self.num_steps} critic-only rollout step(s) ({self.cfg.pipeline.critic_seed_epochs} epoch(s) "
            f"over {len(self.ctx.tasks_for(self.cfg))} tasks), actor frozen, reward {self.cfg.reward.kind} (divisor table "
            f"{self.table.digest}), critic LR {self.cfg.critic_optim.learning_rate:g}")


class RPRPhase(RolloutPhase):
  """Recursive Policy-Refine (§2.4): ``pipeline.rollout_steps`` rollout steps, the first
  ``pipeline.critic_only_steps`` critic-only, then joint PPO (TB-GAE, asymmetric clip, clipped value loss)."""
  kind = "rpr"
  trains_actor = True

  def setup(self, actor_params, step=0):
    self.num_steps = self.cfg.pipeline.rollout_steps
    super().setup(actor_params, step)

  def critic_only(self, i):
    return i < self.cfg.pipeline.critic_only_steps

  def describe(self):
    c = self.cfg
    return (f"{self.num_steps} rollout step(s) ({c.pipeline.critic_only_steps} critic-only), reward "
            f"{c.reward.kind} (divisor table {self.table.digest}), actor LR {c.actor_optim.learning_rate:g}, "
            f"critic LR {c.critic_optim.learning_rate:g}")


PHASES = {"rsr": RSRPhase, "critic_seed": CriticSeedPhase, "rpr": RPRPhase}


def _mean(x) -> float | None:
  x = list(x) if not isinstance(x, np.ndarray) else x
  return float(np.mean(x)) if len(x) else None


