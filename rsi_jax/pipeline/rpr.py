"""The Recursive Policy-Refine update (paper §2.4, App. A), in one place.

One rollout step's batch goes through:

1. ``prepare`` (no gradients): π_old log-probs recomputed by the *training-side* actor (not the sampler's;
   those are kept to report the training–inference mismatch) and the old critic values v, on packed passes
   (:mod:`rsi_jax.rl.packing`), then TB-GAE advantages / returns over the retained (generated) tokens in the
   sample layout, each rollout one recursion over its linked segments (Eq. 12) so summarization boundaries
   are not terminal (``rl.gae_impl``: sequential or associative scan).
2. ``rl.ppo_epochs`` x ``rl.minibatches`` updates, each a ``critic_step`` (the first ``critic_only_steps``
   rollout steps of a phase: actor frozen) or a ``joint_step`` (PPO policy loss, Eq. 14 with ε_ℓ=0.30 /
   ε_h=5.00, plus the max-form clipped value loss with ε_V=4.00), each role with its own AdamW chain
   (``make_optimizer``). An update is one or more packed passes whose gradients are accumulated in float32.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rsi_jax.config import Config
from jax.sharding import NamedSharding, PartitionSpec

from rsi_jax.models.actor import target_index
from rsi_jax.models.mesh import batch_shards, batch_sharding
from rsi_jax.models.optim import TrainState, init_train_state, make_optimizer, make_train_step
from rsi_jax.pipeline.multihost import global_array
from rsi_jax.rl.batch import TrajectoryBatch
from rsi_jax.rl.linked_gae import ChainedResult, chain_predecessors, chained_tb_gae, clock_flags, gae_impl
from rsi_jax.rl.losses import ppo_policy_loss, value_loss
from rsi_jax.rl.metrics import combine_pass_metrics, explained_variance, masked_token_mean
from rsi_jax.rl.packing import PassIndex, PassPlan, pass_index, plan_passes, take

# what TB-GAE reads, in the sample layout (sampler logprobs and weight versions stay on the host)
_SAMPLE_FIELDS = ("gen_mask", "turn_ids", "rewards", "dones", "next_row")


def linked_tb_gae(values, batch: dict, gamma_turn: float, lambda_turn: float, links: int | None = None,
                  impl: str = "scan") -> ChainedResult:
  """TB-GAE where row i continues into row ``next_row[i]`` (the next segment of the same rollout): each
  episode is one recursion over its segments' generated tokens, in one pass whatever the number of segments
  (:func:`rsi_jax.rl.linked_gae.chained_tb_gae`, with the turn clock ``batch["clock"]`` that
  :func:`to_device_batch` settles on the host). ``links``: None = whole episodes, k = at most k following
  segments (0 = every segment cut at its end). ``impl``: ``scan`` or ``associative`` (``rl.gae_impl``)."""
  return chained_tb_gae(values, batch["rewards"], batch["clock"], batch["next_row"], gamma_turn, lambda_turn,
                        links=links, impl=impl)


def to_device_batch(batch: TrajectoryBatch, mesh=None) -> dict:
  """The sample-layout arrays TB-GAE reads (:func:`linked_tb_gae`), on the device (``mesh``: replicated over
  it; under multi-host every process holds the same batch and places its own devices' copies): the batch's
  fields and ``clock``, the turn clock of the linked segments (:func:`rsi_jax.rl.linked_gae.clock_flags`,
  computed here on the host; a malformed ``next_row`` raises ValueError)."""
  host = {k: getattr(batch, k) for k in _SAMPLE_FIELDS}
  host["clock"] = clock_flags(batch.gen_mask, batch.turn_ids, batch.dones, batch.next_row)
  if mesh is None:
    return {k: jnp.asarray(v) for k, v in host.items()}
  rep = NamedSharding(mesh, PartitionSpec())
  return {k: global_array(v, rep) for k, v in host.items()}


def learner_passes(cfg: Config, mesh, lengths, samples, pad_multiple: int | None = None):
  """The :class:`~rsi_jax.rl.packing.PassPlan` of ``samples`` for the learner under ``cfg``: the mesh's
  batch shards, ``pipeline.micro_batch``, ``rl.pad_multiple``, ``rl.dynamic_balancing`` and rows of
  ``rl.per_device_token_budget`` x the context axis tokens (a row is split over the context devices)."""
  return plan_passes(lengths, samples=samples, shards=batch_shards(mesh), token_budget=row_budget(cfg, mesh),
                     micro_batch=cfg.pipeline.micro_batch, balance=cfg.rl.dynamic_balancing,
                     pad_multiple=cfg.rl.pad_multiple if pad_multiple is None else pad_multiple)


def row_budget(cfg: Config, mesh) -> int:
  """Most tokens in one packed row: ``rl.per_device_token_budget`` on each of the row's context devices."""
  return cfg.rl.per_device_token_budget * int(mesh.shape.get("context", 1))


def packed_inputs(plan: PassPlan, index: PassIndex, p: int, sample_arrays: dict, mesh) -> dict:
  """Pass ``p`` of a plan as model inputs on the mesh (rows over the batch shards): ``tokens``,
  ``positions``, ``segment_ids`` (1, 2, ... per packed sample), ``loss_index`` (the generated positions, the
  only ones the losses read) and every array of ``sample_arrays`` ((S, Ts) host arrays) in packed layout."""
  g = index.gather[p]
  out = {k: take(np.asarray(v), g) for k, v in sample_arrays.items()}
  out.update(positions=index.positions[p], segment_ids=index.segment_ids[p])
  if "gen_mask" in out:
    out["loss_index"] = target_index(out["gen_mask"])
  return {k: global_array(v, batch_sharding(mesh, v.ndim)) for k, v in out.items()}


def sft_passes(cfg: Config, mesh, batch: TrajectoryBatch) -> tuple[PassPlan, list[dict]]:
  """RSR's SFT update as packed passes for :meth:`TrainStep.accumulate` with ``masked_nll_loss``: the
  trainable segments of ``batch``, each pass's loss divided by the update's segment count (so the passes sum
  to the unpacked loss)."""
  trainable = np.flatnonzero(batch.gen_mask.sum(1) > 0)
  plan = learner_passes(cfg, mesh, batch.segment_ids.sum(1), trainable)
  index = pass_index(plan, batch.tokens.shape[1])
  passes = []
  for p in range(plan.passes):
    data = packed_inputs(plan, index, p, {"tokens": batch.tokens, "gen_mask": batch.gen_mask}, mesh)
    data["mask"] = data.pop("gen_mask")
    passes.append(dict(data, num_samples=np.float32(len(trainable))))
  return plan, passes


def chain_links(batch: TrajectoryBatch) -> int:
  """Longest chain of continued segments minus one (a batch statistic; :func:`linked_tb_gae` needs no bound).
  A malformed ``next_row`` (a cycle, a row continued twice, a link outside the batch) raises ValueError."""
  depth = 0
  for i in np.flatnonzero(chain_predecessors(batch.next_row) < 0):  # each episode from its first segment
    d, j = 0, int(batch.next_row[i])
    while j >= 0:
      d, j = d + 1, int(batch.next_row[j])
    depth = max(depth, d)
  return depth


@dataclasses.dataclass
class RPRTrainer:
  """Actor + critic PPO updates for one phase (one config: its learning rates, clips, clocks).

  The model runs on packed passes (:mod:`rsi_jax.rl.packing`: ``rl.per_device_token_budget`` tokens per
  device and pass, ``rl.dynamic_balancing``, ``pipeline.micro_batch``); TB-GAE runs on the batch's sample
  layout (one segment per row, segments linked by ``next_row``); an update accumulates its passes'
  gradients in float32. Losses and gradients equal the unpacked single-pass ones (to float32 rounding)."""
  cfg: Config
  actor: object  # rsi_jax.models.Actor
  critic: object  # rsi_jax.models.Critic

  def __post_init__(self):
    rl = self.cfg.rl
    self.actor_opt = make_optimizer(self.cfg.actor_optim)
    self.critic_opt = make_optimizer(self.cfg.critic_optim)
    logp_fn = self.actor.token_logprobs_fn()
    values_fn = self.critic.values_fn()
    mesh = self.actor.mesh
    rep = NamedSharding(mesh, PartitionSpec())

    def forward(actor_params, critic_params, batch):  # π_old and v_old of one pass (no gradients)
      args = (batch["tokens"], batch["positions"], batch["segment_ids"])
      return logp_fn(actor_params, *args, index=batch["loss_index"]), values_fn(critic_params, *args)

    self._forward = jax.jit(forward, out_shardings=(batch_sharding(mesh), batch_sharding(mesh)))

    impl = gae_impl(rl.gae_impl)

    def targets(old_logp, old_values, scatter, batch):
      # the passes' per-token outputs back in the sample layout, where TB-GAE links segments
      old_logp, old_values = take(old_logp, scatter), take(old_values, scatter)
      res = linked_tb_gae(old_values, batch, rl.gamma_turn, rl.lambda_turn, impl=impl)
      # the critic's fit before this step's updates (explained variance of the values TB-GAE used)
      ev = explained_variance(old_values, res.returns, batch["gen_mask"])
      return {"old_logp": old_logp, "old_values": old_values, "advantages": res.advantages,
              "returns": res.returns, "explained_variance": ev}

    self._targets = jax.jit(targets, out_shardings=rep)

    def value_part(critic_params, batch):
      v = values_fn(critic_params, batch["tokens"], batch["positions"], batch["segment_ids"])
      return value_loss(v, batch["old_values"], batch["returns"], batch["gen_mask"], clip=rl.value_clip,
                        segment_ids=batch["segment_ids"], num_samples=batch["num_samples"])

    def critic_loss(actor_params, critic_params, batch):
      del actor_params
      loss, m = value_part(critic_params, batch)
      return loss, {f"value/{k}": x for k, x in m.items()}

    def joint_loss(actor_params, critic_params, batch):
      logp = logp_fn(actor_params, batch["tokens"], batch["positions"], batch["segment_ids"],
                     index=batch["loss_index"])
      l_pi, m_pi = ppo_policy_loss(logp, batch["old_logp"], batch["advantages"], batch["gen_mask"],
                                   clip_low=rl.clip_low, clip_high=rl.clip_high,
                                   segment_ids=batch["segment_ids"], num_samples=batch["num_samples"])
      l_v, m_v = value_part(critic_params, batch)
      aux = {**{f"policy/{k}": x for k, x in m_pi.items()}, **{f"value/{k}": x for k, x in m_v.items()},
             "policy/loss": l_pi, "value/loss": l_v}
      return l_pi + l_v, aux

    def has_signal(batch):  # a minibatch without a trainable token makes no update
      return batch["gen_mask"].sum() > 0

    self._critic_step = make_train_step(self.actor, self.actor_opt, critic_loss, self.critic, self.critic_opt,
                                        train_actor=False, has_signal=has_signal)
    self._joint_step = make_train_step(self.actor, self.actor_opt, joint_loss, self.critic, self.critic_opt,
                                       has_signal=has_signal)

  def init_state(self, actor_params, critic_params, train_actor: bool) -> TrainState:
    """Fresh optimizer states (phases transfer weights only, App. A)."""
    return init_train_state(self.actor, self.actor_opt, actor_params, self.critic, self.critic_opt,
                            critic_params, train_actor=train_actor)

  def start_actor(self, state: TrainState) -> TrainState:
    """After the critic-only steps: the actor joins with a fresh AdamW state."""
    s = self.init_state(state.actor, state.critic, train_actor=True)
    return s._replace(critic_opt=state.critic_opt, step=state.step)

  def prepare(self, state: TrainState, batch: TrajectoryBatch) -> dict:
    """π_old, v_old (packed passes) and TB-GAE (sample layout) of a batch: host arrays in the sample
    layout (``old_logp``, ``old_values``, ``advantages``, ``returns``), ``explained_variance`` and the
    passes' ``packing/*`` statistics."""
    mesh = self.actor.mesh
    lengths = batch.segment_ids.sum(1)
    trainable = [int(i) for i in np.flatnonzero(batch.gen_mask.sum(1) > 0)]
    plan = learner_passes(self.cfg, mesh, lengths, trainable)
    index = pass_index(plan, batch.tokens.shape[1])
    outs = [self._forward(state.actor, state.critic,
                          packed_inputs(plan, index, p, {"tokens": batch.tokens, "gen_mask": batch.gen_mask},
                                        mesh))
            for p in range(plan.passes)]
    logp, values = jnp.stack([o[0] for o in outs]), jnp.stack([o[1] for o in outs])
    scatter = global_array(index.scatter, NamedSharding(mesh, PartitionSpec()))
    out = jax.device_get(self._targets(logp, values, scatter, to_device_batch(batch, mesh)))
    return {**out, "trainable": trainable, **plan.stats()}

  def step(self, state: TrainState, batch: TrajectoryBatch, train_actor: bool, version: int | None = None):
    """One rollout step's updates: π_old, v_old and TB-GAE once, then ``rl.ppo_epochs`` passes of
    ``rl.minibatches`` updates over a fixed shuffle of the trainable samples (segments). Returns (state,
    metrics): means over the updates, except ``policy/ratio_min`` / ``ratio_max`` (extremes over the step),
    the update counts, the explained variance of the pre-update values and the ``packing/*`` statistics of
    the step's passes. ``version``: the weight version of ``state.actor``; tokens sampled by it give the
    implementation mismatch (``mismatch/*``), older ones the policy drift (``drift/*``) and the staleness.
    ``state`` is donated: use the returned one."""
    if train_actor and state.actor_opt is None:
      raise ValueError("joint step with a frozen-actor state: call start_actor(state) first")
    rl, mesh = self.cfg.rl, self.actor.mesh
    prep = self.prepare(state, batch)
    trainable = prep.pop("trainable")
    # fewer trainable samples than rl.minibatches (a step with many infrastructure failures or stale episodes):
    # one sample per minibatch, rather than stopping the run
    minibatches = min(rl.minibatches, len(trainable)) or rl.minibatches
    ev = prep.pop("explained_variance")
    # the step's per-token critic values and TB-GAE advantages (sample layout), for its transcripts
    self.last_targets = {"old_values": np.asarray(prep["old_values"]), "advantages": np.asarray(prep["advantages"])}
    packing = {k: prep.pop(k) for k in list(prep) if k.startswith("packing/")}
    sample_arrays = {"tokens": batch.tokens, "gen_mask": batch.gen_mask, **prep}
    lengths = batch.segment_ids.sum(1)
    fn = self._joint_step if train_actor else self._critic_step
    order = np.random.default_rng(int(state.step)).permutation(trainable)
    groups = [np.sort(g) for g in np.array_split(order, minibatches)]
    layouts = []
    for g in groups:
      plan = learner_passes(self.cfg, mesh, lengths, g)
      layouts.append((plan, pass_index(plan, batch.tokens.shape[1])))
    updates = []
    for _ in range(rl.ppo_epochs):
      for (plan, index), g in zip(layouts, groups):
        n = np.float32(len(g))  # the minibatch's samples: the E_j denominator of every pass
        passes = [dict(packed_inputs(plan, index, p, sample_arrays, mesh), num_samples=n)
                  for p in range(plan.passes)]
        state, loss, aux = fn.accumulate(state, passes, combine=combine_pass_metrics)
        updates.append(dict(jax.device_get(aux), loss=loss))
    counts = ("skipped", "empty")
    metrics = {k: float(np.mean([u[k] for u in updates])) for k in updates[0] if k not in counts}
    for k in metrics:
      if k.endswith("ratio_max"):
        metrics[k] = float(max(u[k] for u in updates))
      elif k.endswith("ratio_min"):
        metrics[k] = float(min(u[k] for u in updates))
    metrics["skipped_updates"] = int(sum(u["skipped"] for u in updates))  # non-finite: weights untouched
    metrics["empty_updates"] = int(sum(u["empty"] for u in updates))  # no trainable token: no update
    metrics.update(token_version_metrics(np.asarray(prep["old_logp"]), batch, version),
                   updates=len(updates) - metrics["skipped_updates"] - metrics["empty_updates"],
                   minibatches=minibatches,
                   **{"value/explained_variance": float(ev)}, **packing,
                   **advantage_scale(np.asarray(prep["advantages"]), batch.gen_mask),
                   return_mean=float(masked_token_mean(prep["returns"], batch.gen_mask)))
    return state, metrics


def advantage_scale(adv: np.ndarray, gen_mask: np.ndarray) -> dict:
  """The step's advantages over the generated tokens: ``advantage_mean``, ``advantage_abs_mean`` (the size of
  the policy-gradient signal: with unnormalized TB-GAE it is |reward − value| scale, 0 when every reward is
  predicted) and ``advantage_std``; 0 when there is no generated token."""
  a = adv[np.asarray(gen_mask) > 0].astype(np.float64)
  if a.size == 0:
    return {"advantage_mean": 0.0, "advantage_abs_mean": 0.0, "advantage_std": 0.0}
  return {"advantage_mean": float(a.mean()), "advantage_abs_mean": float(np.abs(a).mean()),
          "advantage_std": float(a.std())}


def token_version_metrics(train_logp: np.ndarray, batch: TrajectoryBatch, version: int | None) -> dict:
  """|log π_train − log π_sampler| on the generated tokens of trained rows, split by who sampled them: the
  learner's current weights (``mismatch/*``: implementation mismatch between sampler and learner) or older
  ones (``drift/*``: policy drift of stale samples), plus the staleness (version − token version) in updates.
  ``version`` None: every token counts as current."""
  m = batch.gen_mask > 0
  tv = batch.weight_versions
  cur = m if version is None else m & (tv == version)
  old = m & ~cur
  out = {}
  for name, sel in (("mismatch", cur), ("drift", old)):
    d = np.abs(train_logp[sel] - batch.sampler_logprobs[sel])
    out[f"{name}/abs_mean"] = float(d.mean()) if d.size else 0.0
    out[f"{name}/abs_max"] = float(d.max()) if d.size else 0.0
    out[f"{name}/tokens"] = int(sel.sum())
  st = (version - tv[m]) if version is not None and m.any() else np.zeros(1)
  out["staleness/mean"] = float(st.mean())
  out["staleness/max"] = int(st.max())
  return out
