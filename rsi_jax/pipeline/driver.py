"""The training program: the phase plan as one resumable, observable run (``python -m rsi_jax.train``).

Base ─RSR-1─► θ1 ─critic seed─► φ_seed ─RPR-1─► (θ1⁺, φ1⁺) ─RSR-2─► θ2 (Δφ = 0) ─RPR-2─► final

The driver owns the order of the phases, where each phase's weights come from, checkpoints, resume, metrics
and the console; each phase (:mod:`rsi_jax.pipeline.phases`: the interface; the kinds in
:mod:`~rsi_jax.pipeline.rsr_phase` and :mod:`~rsi_jax.pipeline.rollout_phase`) owns what its steps do. For every phase:

1. starting weights: ``pipeline.actor_from`` / ``critic_from`` (the previous phase's output by default,
   ``init``, or a checkpoint folder) — weights only; optimizer states start fresh (checked) and the RNG
   seed is the phase's own;
2. resume: if the phase's checkpoint folder holds a complete step, params, optimizer states, update
   counter, seed and rollout cursor are restored from it and the phase continues after that step;
3. steps, each logged (``metrics.jsonl``, TensorBoard, one console line) and checkpointed every
   ``pipeline.checkpoint_every`` steps and at the phase's end (asynchronous Orbax writes); SIGTERM (or Ctrl-C)
   aborts what waits for episodes (a rollout step, the RSR funnel, an in-training evaluation), saves the
   newest completed step, and stops with :class:`~rsi_jax.pipeline.preemption.Preempted`; a cut evaluation
   runs again on the rerun;
4. invariants: Δφ = 0 across a phase that does not train the critic (RSR), a fresh optimizer state at every
   phase start; a violation raises :class:`~rsi_jax.pipeline.errors.InvariantError`;
5. a lineage entry (``lineage.json``): where its weights came from, its output, content digests of both
   roles, the config digest, the reward-table digest and the code version.

The plan and its pre-flight checks are :mod:`rsi_jax.pipeline.plan`, the run folder's layout
:mod:`rsi_jax.pipeline.run_folder`, the stop notice :mod:`rsi_jax.pipeline.preemption`, the console lines
:mod:`rsi_jax.pipeline.console`, the in-training evaluations :mod:`rsi_jax.pipeline.evaluation`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from etils import epath
from jax.sharding import NamedSharding, PartitionSpec

from rsi_jax.config import Config, dump_config
from rsi_jax.models.checkpoint import join, params_digest, resolve_checkpoint
from rsi_jax.pipeline import multihost
from rsi_jax.pipeline import plan as phase_plan  # phase_plan.preflight: looked up when called
from rsi_jax.pipeline.console import Console, format_step
from rsi_jax.pipeline.evaluation import Evaluations
from rsi_jax.pipeline.errors import InvariantError
from rsi_jax.pipeline.phases import PhaseState, RunContext, pool_key
from rsi_jax.pipeline.rollout_phase import CriticSeedPhase, RPRPhase
from rsi_jax.pipeline.rsr_phase import RSRPhase
from rsi_jax.pipeline.plan import INIT, PREVIOUS, PhaseSpec, PreflightError, load_pool
from rsi_jax.pipeline.preemption import Preempted, Stop
from rsi_jax.pipeline.run_folder import (LINEAGE, checkpoint_root, code_version, config_digest, existing_run,
                                         run_dir_of, run_paths, training_settings)
from rsi_jax.stop import StopRequested
from rsi_jax.env.pool import AllEndpointsDown
from rsi_jax.env.tasks import tasks_digest


def read_lineage(run_dir: str) -> list[dict]:
  """The run folder's ``lineage.json`` ([] for a new run); a file that is not a lineage stops the run, naming
  it."""
  f = epath.Path(run_dir) / LINEAGE
  if not f.exists():
    return []
  try:
    entries = json.loads(f.read_text())
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "phase" in e for e in entries):
      raise ValueError("not a list of phase entries")
  except (ValueError, UnicodeDecodeError) as e:
    raise PreflightError(f"{f}: unreadable ({e}): restore it from a copy of the run, or start another run.name")
  return [run_paths(e, run_dir, absolute=True) for e in entries]


def _adam_counts(opt_state) -> list[int]:
  leaves = jax.tree_util.tree_flatten_with_path(opt_state)[0]
  return [int(jax.device_get(x)) for path, x in leaves if "count" in jax.tree_util.keystr(path)]


def check_fresh(train, phase: str):
  """Invariant (App. A): a phase starts with fresh optimizer states (nothing carried across phases)."""
  for role in ("actor_opt", "critic_opt"):
    st = getattr(train, role)
    if st is not None and any(_adam_counts(st)):
      raise InvariantError(f"{phase}: {role} starts with optimizer state carried from elsewhere "
                           f"(update counts {_adam_counts(st)})")
  if int(jax.device_get(train.step)) != 0:
    raise InvariantError(f"{phase}: update counter starts at {int(jax.device_get(train.step))}, not 0")


PHASES = {"rsr": RSRPhase, "critic_seed": CriticSeedPhase, "rpr": RPRPhase}  # phase kind -> its class


class Driver:
  """Runs ``cfg``'s phase plan in ``run.output_dir/run.name``, resuming what is there (``run.resume``)."""

  def __init__(self, cfg: Config, cli_overrides: Sequence[str] = (), console: Console | None = None,
               on_step: Callable[[str, int, dict], None] | None = None, plan: list[PhaseSpec] | None = None):
    self.cfg = cfg
    self.plan = plan  # what preflight(cfg, cli_overrides) returned, where the caller ran it; run() runs it otherwise
    self.cli = list(cli_overrides)
    self.console = console or Console(progress=cfg.run.progress)
    self.on_step = on_step  # test hook: called after each step is logged and checkpointed
    self.run_dir = run_dir_of(cfg)
    self.ckpt_root = checkpoint_root(cfg)
    self.evals = Evaluations(cfg, self.run_dir, self.console)  # in-training evaluations, each actor once

  # -------------------------------------------------------------------------------------------- run

  def run(self) -> dict:
    from rsi_jax.pipeline.metrics import MetricLogger

    plan = self.plan if self.plan is not None else phase_plan.preflight(self.cfg, self.cli)
    rd = epath.Path(self.run_dir)
    primary = multihost.is_primary()  # the process that writes the run's records
    resumed = bool(existing_run(self.cfg))
    # a resumed run trains on with the config it was trained with, unless run.allow_config_change says otherwise,
    # and on the task pools its checkpoints were made with; both checked before anything is written
    self._config_changes = multihost.from_primary(self._changed_keys, rd, resumed)
    if self._config_changes and not self.cfg.run.allow_config_change:
      raise PreflightError(
          f"the config differs from the one this run was trained with ({rd / 'config.yml'}) in "
          f"{'; '.join(self._config_changes)}: resume with the run's own settings, choose another run.name, or "
          f"add run.allow_config_change=true to resume with the change (recorded in lineage.json)")
    env_pool = phase_plan.environment(self.cfg, plan)
    try:
      pools, refused = self._task_pools(plan, env_pool)  # once: the pool check and the phases see the same pools
      multihost.from_primary(self._check_pools, plan, pools)
      if primary:
        rd.mkdir(parents=True, exist_ok=True)
        self._write_config(rd)
      self.lineage = multihost.from_primary(read_lineage, self.run_dir)
      done = {e["phase"]: e for e in self.lineage}
      self.metrics = MetricLogger(self.run_dir, writes=primary)
      self.evals.metrics = self.metrics
      ctx = self._context(plan, env_pool, pools, refused)
    except BaseException:
      env_pool.close()
      raise
    mem = {}  # weights of the phase this process just ran: {"entry": ..., "actor": ..., "critic": ...}
    prev = None
    t0 = time.time()
    try:
      with Stop(self.cfg.run.preempt_budget_s, self.console) as stop:
        # long waits inside a phase (a step's episodes, the RSR funnel, an evaluation) end early on a notice;
        # on several processes they all leave at the step's next exchange (multihost.gather_or_stop /
        # from_primary), and between steps they agree on it (stop.now)
        ctx.stop = stop
        for index, spec in enumerate(plan):
          if spec.name in done:
            prev = done[spec.name]
            self.console.line(f"[{spec.name}] done earlier: {prev['output']}")
            continue
          if prev is not None and stop.now():  # a notice during the previous phase's end: stop before this one
            raise Preempted(prev["output"], stop.signal_name)
          prev, mem = self._run_phase(ctx, plan, index, spec, prev, mem, stop)
      report = self.evals.final_report() if primary else None
    finally:
      if ctx.sampler is not None:
        ctx.sampler.close()
      ctx.pool.close()
      self.metrics.close()
    plots = self.metrics.plot()
    counts = multihost.sum_counts(ctx.pool.counts)  # every process's episodes
    return {"run_dir": self.run_dir, "checkpoints": self.ckpt_root, "lineage": str(rd / LINEAGE),
            "eval_report": report,
            "metrics": str(rd / "metrics.jsonl"), "tensorboard": str(rd / "tensorboard"),
            "plots": str(rd / "plots"), "plot_files": plots, "final": prev["output"] if prev else None,
            "episodes": counts.pop("episodes", 0), "infra_failures": counts.pop("infra_failures", 0),
            "aborted": counts.pop("aborted", 0), "retried": counts.pop("infra_failures.retried", 0),
            "seconds": time.time() - t0, "resumed": resumed}

  def _changed_keys(self, rd, resumed: bool) -> list[str]:
    """``key: old -> new`` for every setting that changes what the run computes and differs from the run
    folder's ``config.yml`` (empty for a new run)."""
    f = rd / "config.yml"
    if not (resumed and f.exists()):
      return []
    old, new = training_settings(f.read_text()), training_settings(dump_config(self.cfg))
    return [f"{k}: {old.get(k, '(unset)')!r} -> {new.get(k, '(unset)')!r}" for k in sorted(old.keys() | new.keys())
            if old.get(k, "(unset)") != new.get(k, "(unset)")]

  def _task_pools(self, plan, env_pool) -> tuple[dict, dict]:
    """Every phase's task pool, {pool_key: tasks} (a phase may set its own env.tasks_dir / env.max_tasks), and
    {tasks_dir: refused folders}; base images are checked against ``env_pool``'s Docker endpoints."""
    from rsi_jax.env.dockerfiles import image_check
    from rsi_jax.eval.run import image_presence
    images = image_check(env_pool.settings.image_map, image_presence(env_pool)) if env_pool.clients else None
    pools, refused = {}, {}
    for c in [self.cfg] + [s.cfg for s in plan]:
      if pool_key(c) not in pools:
        pools[pool_key(c)], refused[c.env.tasks_dir] = load_pool(c, images)
    return pools, refused

  def _check_pools(self, plan, pools):
    """A phase with checkpoints resumes on the task pool they were trained on (its rollout cursor and Q_clean
    index that pool's order): a pool that env.tasks_dir / env.max_tasks now give otherwise is refused."""
    from rsi_jax.models.checkpoint import CheckpointError, read_meta
    for spec in plan:
      d = epath.Path(join(self.ckpt_root, spec.name))
      steps = sorted(int(x.name) for x in d.iterdir() if x.name.isdigit()) if d.exists() else []
      if not steps:
        continue
      try:
        meta = read_meta(join(str(d), str(steps[-1]))) or {}
      except CheckpointError:
        continue  # the resume itself refuses it, or falls back to an intact step
      pool = pools[pool_key(spec.cfg)]
      if meta.get("tasks_digest", tasks_digest(pool)) != tasks_digest(pool):
        raise PreflightError(f"{spec.name}: its checkpoint at step {steps[-1]} was trained on another task pool "
                             f"(digest {meta['tasks_digest']}) than env.tasks_dir / env.max_tasks now give "
                             f"({tasks_digest(pool)}, {len(pool)} tasks): restore them, or remove "
                             f"{join(str(d), str(steps[-1]))} and the phase's later checkpoints to start it anew")

  def _write_config(self, rd):
    f = rd / "config.yml"
    if self._config_changes:  # allowed by run.allow_config_change: the earlier one is kept beside it
      n = len(list(rd.glob("config.*.yml")))
      (rd / f"config.{n}.yml").write_text(f.read_text())
      self.console.line(f"note: resuming with a changed config (run.allow_config_change): "
                        f"{'; '.join(self._config_changes)}; the earlier one is kept as config.{n}.yml")
    f.write_text(dump_config(self.cfg))

  def _context(self, plan, pool, pools, refused) -> RunContext:
    from rsi_jax.models import Actor, ChatRenderer, Critic, build_mesh, load_tokenizer

    cfg = self.cfg
    mesh = build_mesh(cfg)
    actor, critic = Actor(cfg, mesh), Critic(cfg, mesh)
    tok = load_tokenizer(cfg.model.tokenizer_path)
    tasks = pools[pool_key(cfg)]
    # multi-host: every process must run the same plan on the same task pools (request i -> the same task)
    views = multihost.gather_objects([(config_digest(cfg), {k: [t.name for t in v] for k, v in pools.items()})])
    if any(v != views[0] for v in views):
      bad = [i for i, v in enumerate(views) if v != views[0]]
      raise PreflightError(f"the processes differ in their config or task pool (env.tasks_dir): processes {bad} "
                           f"differ from process 0 (config digests {[v[0] for v in views]}, task counts "
                           f"{[sum(map(len, v[1].values())) for v in views]})")
    for tasks_dir, folders in sorted(refused.items()):
      for r in folders:
        self.console.line(f"warning: task folder {r.task} of {tasks_dir} refused: {r.reason}")
    every = list({t.name: t for v in pools.values() for t in v}.values())
    for name, lines in sorted(pool.check_base_images(every).items()):
      for line in lines:
        self.console.line(f"warning: task {name}: {line}")
    n = sum(x.size for x in jax.tree.leaves(actor.abstract_params))
    axes = {k: v for k, v in mesh.shape.items() if v > 1} or {"single device": 1}
    self.console.line(f"rsi_jax run {self.run_dir}: MaxText Qwen3 '{cfg.model.name}' ({n:,} params) on mesh "
                      f"{axes} ({mesh.devices.size} {jax.default_backend()} device(s)); {len(tasks)} tasks from "
                      f"{cfg.env.tasks_dir}; phases {' -> '.join(cfg.pipeline.phases)}")
    for spec in plan:
      if pool_key(spec.cfg) != pool_key(cfg):
        self.console.line(f"[{spec.name}] its own task pool: {len(pools[pool_key(spec.cfg)])} tasks from "
                          f"{spec.cfg.env.tasks_dir}")
    return RunContext(cfg, mesh, actor, critic, tok, ChatRenderer(tok), pool, pools, self.run_dir)

  # ------------------------------------------------------------------------------------------ phases

  def _run_phase(self, ctx, plan, index, spec, prev, mem, stop):
    from rsi_jax.pipeline.checkpoints import PhaseCheckpoints, opt_targets, optimizer_change_hint

    t0 = time.time()
    cfg = spec.cfg
    workdir = lambda name: join(self.run_dir, "phases", name)  # noqa: E731
    phase = PHASES[spec.kind](spec.name, cfg, ctx, workdir(spec.name),
                              earlier=[(p.name, p.kind, workdir(p.name)) for p in plan[:index]])
    ckpts = PhaseCheckpoints(join(self.ckpt_root, spec.name), keep=cfg.pipeline.keep_checkpoints)
    latest, skipped = None, []
    if ckpts.latest_step() is not None:  # resume this phase from its newest intact checkpoint
      targets = {"actor": ctx.actor.abstract_params, "critic": ctx.critic.abstract_params}
      for item, opt in phase.optimizers().items():
        targets[item] = opt_targets(ctx.actor if item == "actor_opt" else ctx.critic, opt)
      latest, trees, meta, skipped = ckpts.restore_newest_intact(targets)
      if latest is None:
        raise PreflightError(f"{spec.name}: no intact checkpoint in {ckpts.directory}: "
                             + "; ".join(f"step {m}: {why}" for m, why in skipped) + optimizer_change_hint(self._config_changes, skipped))
      for m, why in skipped:  # set aside (renamed, not deleted): the phase redoes those steps
        self.console.line(f"[{spec.name}] step {m} was refused ({why}); kept as {ckpts.set_aside(m)}")
    if latest is not None:
      rep = NamedSharding(ctx.mesh, PartitionSpec())
      train = _train_state(trees, jax.device_put(jnp.asarray(meta["update"], jnp.int32), rep))
      carried = trees.get("critic") if not phase.uses_critic else None
      if not phase.uses_critic:
        train = train._replace(critic=None)
      state = PhaseState(train, seed=int(meta["seed"]), cursor=int(meta["cursor"]), data=meta.get("data_state"))
      started_from = run_paths(meta["started_from"], self.run_dir, absolute=True)
      start_digest = meta.get("critic_digest_at_start")
      phase.actor_start_digest = meta.get("actor_digest_at_start")  # the phase's input, not the mid-phase actor
      self.console.line(f"[{spec.name}] resuming after step {latest} ({ckpts.step_dir(latest)})")
    else:
      actor_p, actor_src = self._actor_start(ctx, spec, index, prev, mem)
      critic_p, critic_src = self._critic_start(ctx, spec, index, prev, mem, actor_p, phase.uses_critic)
      train = phase.init_state(actor_p, critic_p if phase.uses_critic else None)
      check_fresh(train, spec.name)
      carried = None if phase.uses_critic else critic_p
      state = PhaseState(train, seed=_phase_seed(self.cfg.run.seed, spec.name))
      started_from = {"actor": actor_src, "critic": critic_src}
      start_digest = params_digest(critic_p) if critic_p is not None else None
      phase.actor_start_digest = params_digest(actor_p)
      latest = 0
    try:
      return self._steps(ctx, spec, phase, ckpts, state, latest, started_from, start_digest, carried, stop, t0)
    finally:
      phase.close()
      ckpts.close()

  def _steps(self, ctx, spec, phase, ckpts, state, latest, started_from, start_digest, carried, stop, t0):
    cfg = spec.cfg
    try:
      phase.setup(state.train.actor, latest)  # an RSR phase runs its funnel here
    except StopRequested as e:  # nothing of this phase to save: its newest state is what it started from
      raise Preempted(ckpts.step_dir(latest) if latest else started_from["actor"], str(e), saved=bool(latest)) \
          from None
    n = phase.num_steps
    self.metrics.truncate(list(self.cfg.pipeline.phases), spec.name, latest)
    self.evals.drop_after(spec.name, latest)  # evaluations of the steps about to be redone
    self.console.line(f"[{spec.name}] {spec.kind}: {phase.describe()}; weights: actor <- "
                      f"{started_from['actor']}, critic <- {started_from['critic']}")
    for line in phase.report().splitlines():
      self.console.line(f"[{spec.name}]   {line}")

    def meta():
      return {"phase": spec.name, "seed": state.seed, "cursor": state.cursor, "data_state": state.data,
              "started_from": run_paths(started_from, self.run_dir, absolute=False),
              "critic_digest_at_start": start_digest, "actor_digest_at_start": phase.actor_start_digest,
              "reward_table_digest": phase.reward_digest(),
              "config_digest": config_digest(cfg), "tasks_digest": tasks_digest(ctx.tasks_for(cfg))}

    def full(train):  # what a checkpoint of this phase holds: the carried critic too
      return train if phase.uses_critic else train._replace(critic=carried)

    if list(self.cfg.pipeline.phases).index(spec.name) == 0 and latest == 0:  # the first phase's starting actor
      self.evals.evaluate_or_stop(ctx, "base", 0, state.train.actor, started_from["actor"], saved=False)
    every = cfg.pipeline.eval_every
    if 0 < latest < n and latest % every == 0:  # resumed: the evaluation an earlier attempt cut (none if done)
      self.evals.evaluate_or_stop(ctx, spec.name, latest, state.train.actor, ckpts.step_dir(latest))
    bar = self.console.bar(n, latest, spec.name)
    try:
      saved = latest  # the newest step on storage
      for i in range(latest, n):
        try:
          state, m = phase.step(state, i)
        except (StopRequested, AllEndpointsDown) as e:  # mid-step: keep the steps that completed, then stop
          if i > saved:
            phase.flush()  # the step files of what is checkpointed are on storage first
            ckpts.save(i, full(state.train), meta())
          ckpts.wait()
          if isinstance(e, AllEndpointsDown):
            raise
          raise Preempted(ckpts.step_dir(i) if i else started_from["actor"], str(e), saved=bool(i)) from None
        self.metrics.log(spec.name, spec.kind, i + 1, m)
        self.console.line(format_step(spec.name, i, n, m))
        bar.update(1)
        preempt = stop.now()
        if (i + 1) % cfg.pipeline.checkpoint_every == 0 or i + 1 == n or preempt:
          phase.flush()  # the step files of what is checkpointed are on storage first
          ckpts.save(i + 1, full(state.train), meta())
          saved = i + 1
        if self.on_step is not None:
          self.on_step(spec.name, i + 1, m)
        if preempt:  # also after a phase's last step: its evaluation and the next phase run on the rerun
          ckpts.wait()
          raise Preempted(ckpts.step_dir(i + 1), stop.signal_name)
        if (i + 1) % every == 0 and i + 1 < n:
          try:
            self.evals.evaluate_or_stop(ctx, spec.name, i + 1, state.train.actor, ckpts.step_dir(i + 1))
          except Preempted:  # the rerun resumes after this step and evaluates it again
            if i + 1 > saved:
              phase.flush()  # the step files of what is checkpointed are on storage first
              ckpts.save(i + 1, full(state.train), meta())
            ckpts.wait()
            raise
      if n == 0 and ckpts.latest_step() is None:  # nothing to train on: the phase's output is its input
        phase.flush()  # the step files of what is checkpointed are on storage first
        ckpts.save(0, full(state.train), meta())
      ckpts.wait()
    finally:
      self.console.close_bar()
    actor_out, critic_out = state.train.actor, (state.train.critic if phase.uses_critic else carried)
    self.evals.evaluate_or_stop(ctx, spec.name, n, actor_out, ckpts.step_dir(n))  # each phase's final weights
    entry = {"phase": spec.name, "kind": spec.kind, "started_from": started_from, "output": ckpts.step_dir(n),
             "steps": n, "optimizer": "fresh at phase start (weights-only handoff)",
             "actor_digest": params_digest(actor_out),
             "critic_digest": params_digest(critic_out) if critic_out is not None else None,
             "config_digest": config_digest(cfg), "reward_table_digest": phase.reward_digest(),
             "reward": cfg.reward.kind if spec.kind != "rsr" else None,
             "actor_lr": cfg.actor_optim.learning_rate if phase.trains_actor else None,
             "critic_lr": cfg.critic_optim.learning_rate if phase.uses_critic else None,
             "lr_schedule": {role: o.schedule_label() for role, o, on in (
                 ("actor", cfg.actor_optim, phase.trains_actor), ("critic", cfg.critic_optim, phase.uses_critic))
                 if on},
             "code_version": code_version(), "seconds": round(time.time() - t0, 1), **phase.lineage_extra()}
    if self._config_changes:  # resumed with run.allow_config_change: the first phase to finish after it says so
      entry["config_changes"], self._config_changes = self._config_changes, []
    if not phase.uses_critic and entry["critic_digest"] != start_digest:
      # Invariant: Δφ = 0 across a phase that does not train the critic (RSR).
      raise InvariantError(f"{spec.name}: the critic changed across an actor-only phase (digest "
                           f"{start_digest} -> {entry['critic_digest']}): Δφ must be 0")
    self.lineage.append(entry)
    if multihost.is_primary():
      rd = epath.Path(self.run_dir)
      tmp = rd / (LINEAGE + ".tmp")
      tmp.write_text(json.dumps([run_paths(e, self.run_dir, absolute=False) for e in self.lineage], indent=1))
      tmp.replace(rd / LINEAGE)
    self.metrics.plot()
    self.console.line(f"[{spec.name}] done in {entry['seconds']:.0f}s: {entry['output']} (actor "
                      f"{entry['actor_digest']}, critic {entry['critic_digest']})")
    return entry, {"entry": entry, "actor": actor_out, "critic": critic_out}

  def _actor_start(self, ctx, spec, index, prev, mem):
    src = spec.actor_from
    if src == PREVIOUS and prev is not None:
      if mem.get("entry") is prev:
        return mem["actor"], prev["output"]
      return self._restore(ctx, prev["output"], "actor"), prev["output"]
    if src in (PREVIOUS, INIT):
      p = ctx.actor.initial_params(jax.random.key(self.cfg.run.seed))
      return p, (f"hf:{self.cfg.model.hf_path}" if self.cfg.model.hf_path else f"init(seed={self.cfg.run.seed})")
    path = resolve_checkpoint(src)
    return self._restore(ctx, path, "actor"), path

  def _critic_start(self, ctx, spec, index, prev, mem, actor_params, needed: bool):
    src = spec.critic_from
    if src == PREVIOUS and prev is not None and prev.get("critic_digest") is not None:
      if mem.get("entry") is prev:
        return mem["critic"], prev["output"]
      return self._restore(ctx, prev["output"], "critic"), prev["output"]
    if src == PREVIOUS and not needed:
      return None, None  # no critic exists yet; an actor-only phase needs none
    if src in (PREVIOUS, INIT):
      key = jax.random.fold_in(jax.random.key(self.cfg.run.seed), _phase_seed(0, spec.name))
      return (ctx.critic.init_from_actor(actor_params, key),
              f"backbone of the phase's starting actor + fresh value head (seed {self.cfg.run.seed})")
    path = resolve_checkpoint(src)
    return self._restore(ctx, path, "critic"), path

  @staticmethod
  def _restore(ctx, path: str, role: str):
    from rsi_jax.models.checkpoint import restore_params
    model = ctx.actor if role == "actor" else ctx.critic
    return restore_params(path, **{role: model.abstract_params})[role]


def _train_state(trees: dict, step):
  from rsi_jax.models.optim import TrainState
  return TrainState(trees["actor"], trees.get("actor_opt"), trees.get("critic"), trees.get("critic_opt"), step)


def _phase_seed(seed: int, phase: str) -> int:
  from rsi_jax.env.rollouts import derive_seed
  return derive_seed(seed, "phase", phase)
