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
RSR's discovery is a :class:`Discovery` object; the RSR funnel plugs in there without touching the driver.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import Counter

import jax
import numpy as np
from etils import epath

from rsi_jax.config import Config
from rsi_jax.models.optim import TrainState, init_train_state, make_optimizer, make_train_step, masked_nll_loss
from rsi_jax.pipeline.rollouts import SeededPolicy, TaskOrder, collect, derive_seed
from rsi_jax.policy import SamplingParams
from rsi_jax.rl.batch import Sample, assemble_batch, episode_samples


class InvariantError(RuntimeError):
  """A property the method relies on does not hold; the run stops."""


class NoTrainableSamples(RuntimeError):
  """A step has nothing to train on (every prompt rejected, every episode an infrastructure failure, ...)."""


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
  tasks: list
  run_dir: str
  sampler: object = None  # rsi_jax.sampler.server.SamplerServer, created with the first weights it serves

  def serve(self, actor_params):
    """Point the sampler at ``actor_params`` (creating it on first use) and wait until it serves them."""
    if self.sampler is None:
      from rsi_jax.sampler.server import SamplerServer
      self.sampler = SamplerServer.from_config(self.cfg, actor_params, tokenizer=self.tokenizer)
    else:
      self.sampler.update_weights(actor_params)
      self.sampler.wait_swapped()


@dataclasses.dataclass
class PhaseState:
  train: TrainState
  seed: int  # the phase's RNG seed (task order, SFT order, per-request sampling seeds)
  cursor: int = 0  # rollout requests made so far in this phase (the data order's position)


class Phase:
  kind = ""
  trains_actor = False
  uses_critic = False  # False: the critic is carried past the phase untouched (checked by the driver)

  def __init__(self, name: str, cfg: Config, ctx: RunContext, workdir: str):
    self.name, self.cfg, self.ctx, self.workdir = name, cfg, ctx, workdir
    self.num_steps = 0

  def setup(self, actor_params) -> None:
    pass

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


# ------------------------------------------------------------------------------------------------ RSR


class Discovery:
  """RSR discovery (§2.1): (task, trajectory, harness) triples the protected verifier passed, as token
  records under the target harness. This one replays each task's reference solution through the target
  harness (a scripted policy): the verified data a random-init or small actor cannot yet find itself."""
  description = "reference solutions replayed through the target harness"

  def __call__(self, ctx: RunContext, cfg: Config, actor_params) -> list:
    from rsi_jax.env import ScriptedPolicy, make_harness
    from rsi_jax.env.harness import oracle_commands

    def harness_for(task):
      policy = ScriptedPolicy(ctx.tokenizer, [json.dumps({"command": oracle_commands(task), "done": False}),
                                              '{"done": true}'])
      return make_harness(cfg.rsr.target_harness, policy, ctx.renderer, SamplingParams(max_new_tokens=4096),
                          env_cfg=dataclasses.replace(cfg.env, max_turns=3))

    tasks = [t for t in ctx.tasks if t.solution is not None]
    results = ctx.pool.run([(t, harness_for(t)) for t in tasks])
    return [r for r in results if r.success == 1 and r.segments]


class RSRPhase(Phase):
  """Actor-only SFT (Eq. 3, masked to generated tokens) on the discovered verified trajectories:
  ``pipeline.sft_epochs`` passes, ``rollout.global_batch`` trajectories per update, a seeded order."""
  kind = "rsr"
  trains_actor = True
  discovery = Discovery()

  def __init__(self, *a, **kw):
    super().__init__(*a, **kw)
    self.opt = make_optimizer(self.cfg.actor_optim)
    nll = masked_nll_loss(self.ctx.actor)
    self._step = make_train_step(self.ctx.actor, self.opt, nll)
    self.samples: list[list[Sample]] = []

  def setup(self, actor_params):
    path = epath.Path(self.workdir) / "sft_data.npz"
    if path.exists():  # an interrupted attempt stored its discovery
      self.samples = _load_samples(path)
      self.found = f"{len(self.samples)} verified trajectories (stored by an earlier attempt)"
    else:
      accepted = self.discovery(self.ctx, self.cfg, actor_params)
      self.samples = [episode_samples(r.segments, i) for i, r in enumerate(accepted)]
      if not self.samples:
        raise NoTrainableSamples(f"{self.name}: discovery ({self.discovery.description}) verified no "
                                 f"trajectory on {len(self.ctx.tasks)} task(s)")
      path.parent.mkdir(parents=True, exist_ok=True)
      _save_samples(path, self.samples)
      self.found = f"{len(self.samples)} verified trajectories ({self.discovery.description})"
    b = self.cfg.rollout.global_batch
    self.per_epoch = -(-len(self.samples) // b)
    self.num_steps = self.cfg.pipeline.sft_epochs * self.per_epoch
    # one compiled shape for the whole phase: rows for the b trajectories with the most segments, columns
    # for the longest segment
    self.rows = _round_rows(sum(sorted((len(e) for e in self.samples), reverse=True)[:b]), self.ctx.mesh)
    self.pad_to = max(len(s.ids) for e in self.samples for s in e)

  def _order(self, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng(derive_seed(seed, "sft", epoch)).permutation(len(self.samples))

  def describe(self):
    return (f"{self.found}; {self.cfg.pipeline.sft_epochs} epoch(s) x {self.per_epoch} update(s), "
            f"actor LR {self.cfg.actor_optim.learning_rate:g}, critic carried unchanged")

  def optimizers(self):
    return {"actor_opt": self.opt}

  def init_state(self, actor_params, critic_params):
    return init_train_state(self.ctx.actor, self.opt, actor_params)

  def step(self, state, i):
    t0 = time.time()
    epoch, j = divmod(i, self.per_epoch)
    b = self.cfg.rollout.global_batch
    idx = self._order(state.seed, epoch)[j * b:(j + 1) * b]
    eps = [self.samples[k] for k in idx]
    pad = self.cfg.rl.pad_multiple
    batch = assemble_batch(eps, [1.0] * len(eps), pad_multiple=pad, pad_id=self.ctx.tokenizer.pad_id,
                           num_rows=self.rows)
    t_pad = -(-self.pad_to // pad) * pad
    data = {k: _pad_cols(v, t_pad) for k, v in (("tokens", batch.tokens), ("positions", batch.positions),
                                                ("segment_ids", batch.segment_ids), ("mask", batch.gen_mask))}
    train, _, aux = self._step(state.train, data)
    aux = jax.device_get(aux)
    tokens = int(batch.gen_mask.sum())
    dt = time.time() - t0
    m = {"loss": float(aux["nll_per_token"]), "nll_per_token": float(aux["nll_per_token"]),
         "actor_grad_norm": float(aux["actor_grad_norm"]), "skipped_updates": int(aux["skipped"]),
         "epoch": epoch, "trajectories": len(eps), "sft_tokens": tokens, "tokens_per_s": tokens / max(dt, 1e-9),
         "step_seconds": dt}
    return dataclasses.replace(state, train=train), m


def _pad_cols(a: np.ndarray, t: int) -> np.ndarray:
  return a if a.shape[1] == t else np.pad(a, ((0, 0), (0, t - a.shape[1])))


def _save_samples(path, episodes: list[list[Sample]]):
  flat = [(e, s) for e, segs in enumerate(episodes) for s in segs]
  lens = np.asarray([len(s.ids) for _, s in flat], np.int64)
  cat = lambda f, dt: np.concatenate([np.asarray(getattr(s, f), dt) for _, s in flat])  # noqa: E731
  tmp = epath.Path(str(path) + ".tmp")
  with tmp.open("wb") as f:
    np.savez(f, lengths=lens, episode=np.asarray([e for e, _ in flat], np.int64), ids=cat("ids", np.int32),
             gen_mask=cat("gen_mask", bool), logprobs=cat("logprobs", np.float32),
             turn_ids=cat("turn_ids", np.int32))
  tmp.replace(path)


def _load_samples(path) -> list[list[Sample]]:
  with epath.Path(path).open("rb") as f:
    z = dict(np.load(f))
  out: dict[int, list[Sample]] = {}
  start = 0
  for n, e in zip(z["lengths"], z["episode"]):
    sl = slice(start, start + int(n))
    out.setdefault(int(e), []).append(Sample(z["ids"][sl], z["gen_mask"][sl], z["logprobs"][sl],
                                             z["turn_ids"][sl], int(e)))
    start += int(n)
  return [out[k] for k in sorted(out)]


# ------------------------------------------------------------------------------------------ rollouts


class RolloutPhase(Phase):
  """Phases that learn from episodes of the current actor (critic seed, RPR): one rollout step per phase
  step, then the PPO / value updates of :class:`~rsi_jax.pipeline.rpr.RPRTrainer`."""
  uses_critic = True

  def __init__(self, *a, **kw):
    super().__init__(*a, **kw)
    from rsi_jax.pipeline.rpr import RPRTrainer
    from rsi_jax.rl.divisors import divisor_table_from_config
    self.trainer = RPRTrainer(self.cfg, self.ctx.actor, self.ctx.critic)
    self.table = divisor_table_from_config(self.cfg.reward)
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

  def setup(self, actor_params):
    self.ctx.serve(actor_params)

  def _harness(self, state: PhaseState, i: int, index: int):
    from rsi_jax.env import make_harness
    policy = self.ctx.sampler
    if self.cfg.rollout.deterministic:
      policy = SeededPolicy(policy, derive_seed(state.seed, "rollout", i, index))
    return make_harness(self.cfg.env.harness, policy, self.ctx.renderer, self.sampling, env_cfg=self.cfg.env)

  def step(self, state, i):
    from rsi_jax.rl.rewards import outcome_rewards
    cfg, ctx = self.cfg, self.ctx
    t0 = time.time()
    order = TaskOrder(ctx.tasks, state.seed, cfg.rollout.responses_per_task)
    n = cfg.rollout.requested
    jobs = [(order[state.cursor + k], self._harness(state, i, state.cursor + k)) for k in range(n)]
    eps, not_used = collect(ctx.pool, jobs, cfg.rollout.global_batch, deterministic=cfg.rollout.deterministic)
    t_roll = time.time() - t0
    rewards, mask = outcome_rewards([e.outcome for e in eps], [e.family for e in eps], cfg.reward.kind,
                                    self.table)
    samples = [episode_samples(e.segments, j) for j, e in enumerate(eps)]
    batch = assemble_batch(samples, rewards, mask > 0, pad_multiple=cfg.rl.pad_multiple,
                           pad_id=ctx.tokenizer.pad_id,
                           num_rows=_round_rows(sum(len(s) for s in samples), ctx.mesh, cfg.rl.minibatches))
    trainable = [j for j, s in enumerate(samples) if mask[j] > 0 and any(x.gen_mask.any() for x in s)]
    if not trainable:
      why = Counter(e.failure_kind or e.stop_reason or "no generated token" for e in eps)
      raise NoTrainableSamples(f"{self.name} step {i + 1}: none of the {len(eps)} episodes has a trainable "
                               f"generated token ({dict(why)}): infrastructure failures "
                               f"{int((mask == 0).sum())}, stop reasons {dict(Counter(e.stop_reason for e in eps))}")
    # Invariant: one terminal reward per trainable episode that generated tokens, nowhere else.
    if int(batch.dones.sum()) != len(trainable) or np.count_nonzero(batch.rewards[batch.dones == 0]):
      raise InvariantError(f"{self.name} step {i + 1}: rewards placed {int(batch.dones.sum())} times for "
                           f"{len(trainable)} trainable episodes")
    train_actor = not self.critic_only(i)
    train = state.train
    if train_actor and train.actor_opt is None:
      train = self.trainer.start_actor(train)  # fresh AdamW state for the actor after the critic-only steps
    t1 = time.time()
    train, m = self.trainer.step(train, batch, train_actor)
    if train_actor:
      ctx.serve(train.actor)
    t_train = time.time() - t1
    ok = mask > 0
    gen_tokens = sum(e.generated_tokens for e in eps)
    m.update(
        train_actor=int(train_actor), reward_mean=_mean(rewards[ok]), success_mean=_mean(
            [float(e.success or 0) for e, k in zip(eps, ok) if k]),
        turns_mean=_mean([len(e.turns) for e in eps]), episodes=len(eps), aborted_episodes=not_used,
        infra_failures=int((~ok).sum()), trainable_episodes=len(trainable),
        prompt_rejected=sum(e.stop_reason == "context_exhausted" for e in eps),
        generated_tokens=gen_tokens, tokens_per_s=gen_tokens / max(t_roll, 1e-9), staleness=0,
        weight_version=ctx.sampler.weight_version, rollout_seconds=t_roll, train_seconds=t_train,
        step_seconds=time.time() - t0)
    return dataclasses.replace(state, train=train, cursor=state.cursor + n), m


class CriticSeedPhase(RolloutPhase):
  """φ_seed: critic-only updates on rollouts of the frozen actor, ``pipeline.critic_seed_epochs`` passes
  over the task pool (``ceil(epochs x tasks x responses_per_task / rollout.global_batch)`` steps)."""
  kind = "critic_seed"

  def setup(self, actor_params):
    super().setup(actor_params)
    p, r = self.cfg.pipeline, self.cfg.rollout
    self.num_steps = math.ceil(p.critic_seed_epochs * len(self.ctx.tasks) * r.responses_per_task
                               / r.global_batch)

  def critic_only(self, i):
    return True

  def describe(self):
    return (f"{self.num_steps} critic-only rollout step(s) ({self.cfg.pipeline.critic_seed_epochs} epoch(s) "
            f"over {len(self.ctx.tasks)} tasks), actor frozen, reward {self.cfg.reward.kind}, "
            f"critic LR {self.cfg.critic_optim.learning_rate:g}")


class RPRPhase(RolloutPhase):
  """Recursive Policy-Refine (§2.4): ``pipeline.rollout_steps`` rollout steps, the first
  ``pipeline.critic_only_steps`` critic-only, then joint PPO (TB-GAE, asymmetric clip, clipped value loss)."""
  kind = "rpr"
  trains_actor = True

  def setup(self, actor_params):
    super().setup(actor_params)
    self.num_steps = self.cfg.pipeline.rollout_steps

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


def _round_rows(rows: int, mesh, minibatches: int = 1) -> int:
  """Rows padded so every minibatch splits evenly over the mesh's batch shards (data x fsdp)."""
  unit = int(mesh.shape.get("data", 1)) * int(mesh.shape.get("fsdp", 1)) * minibatches
  return -(-rows // unit) * unit
