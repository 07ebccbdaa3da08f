"""The rollout phases: critic seed and RPR, learning from episodes of the current actor (collect, score and
filter, the PPO / value update, serve the new weights)."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time

import numpy as np
from etils import epath

from rsi_jax.env.rollouts import RolloutPolicy, TaskOrder, collect, derive_seed
from rsi_jax.pipeline import multihost
from rsi_jax.pipeline.metrics import read_jsonl
from rsi_jax.pipeline.phases import Phase, PhaseState
from rsi_jax.pipeline.scoring import score_and_filter
from rsi_jax.policy import SamplingParams
from rsi_jax.rl.outcome_table import EPISODE_TIMES, outcome_row
from rsi_jax.stop import StopRequested, wait_all


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
    # what travels: samples, outcomes and records, not the turns' prompts (EpisodeResult.for_exchange); the
    # single-process path takes the same form, so a laptop run trains on exactly what a pod run exchanges
    eps = multihost.gather_or_stop([e.for_exchange() for e in eps], stopped)
    aborted = sum(multihost.gather_objects([aborted]))
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
            f"over {len(self.ctx.tasks_for(self.cfg))} tasks), actor frozen, reward {self.cfg.reward.kind} "
            f"(divisor table {self.table.digest}), critic LR {self.cfg.critic_optim.learning_rate:g}")


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


def _mean(x) -> float | None:
  x = list(x) if not isinstance(x, np.ndarray) else x
  return float(np.mean(x)) if len(x) else None
