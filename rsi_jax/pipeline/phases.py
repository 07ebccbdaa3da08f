"""What every phase kind shares: the run's context, a phase's state and the interface the driver calls.

A phase owns what one of its steps is; the driver owns the order of phases, where their weights come from,
checkpoints, resume, metrics and the console. The interface (:class:`Phase`):

* ``setup(actor_params)`` — anything the phase needs before its first step (RSR: its SFT data), idempotent
  across a resume (it may read what an interrupted attempt stored under ``workdir``);
* ``num_steps`` — how many steps the phase runs (known after ``setup``);
* ``init_state(actor, critic)`` — a :class:`~rsi_jax.models.optim.TrainState` with **fresh** optimizer
  states (phases hand over weights only, paper App. A);
* ``optimizers()`` — the optax chains of the roles it trains (restore targets);
* ``step(state, i)`` — step ``i``: returns ``(state, metrics)``; ``state`` also carries the rollout cursor.

Kinds: :class:`~rsi_jax.pipeline.rsr_phase.RSRPhase` (actor-only SFT on verified trajectories, Eq. 3; the critic is not given to it and
the driver checks it comes out unchanged), :class:`~rsi_jax.pipeline.rollout_phase.CriticSeedPhase` (critic-only
updates on rollouts of the frozen actor) and :class:`~rsi_jax.pipeline.rollout_phase.RPRPhase`
(``pipeline.critic_only_steps`` critic-only steps, then joint PPO).
RSR runs the funnel of :mod:`rsi_jax.rsr` in ``setup`` and trains on what it accepts.
"""

from __future__ import annotations

import dataclasses

from rsi_jax.config import Config
from rsi_jax.models.optim import TrainState

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


def pool_key(cfg) -> tuple:
  """Which task pool a (phase) config draws from."""
  return cfg.env.tasks_dir, cfg.env.max_tasks
