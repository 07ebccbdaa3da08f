"""The Recursive Policy-Refine update (paper §2.4, App. A), in one place.

One rollout step's batch goes through:

1. ``prepare`` (jitted, no gradients): π_old log-probs recomputed by the *training-side* actor (not the
   sampler's; those are kept to report the training–inference mismatch), the old critic values v, and TB-GAE
   advantages / returns over the retained (generated) tokens, with segments of one rollout linked by the
   TB-GAE carry (Eq. 12) so summarization boundaries are not terminal.
2. ``rl.ppo_epochs`` x ``rl.minibatches`` updates, each a ``critic_step`` (the first ``critic_only_steps``
   rollout steps of a phase: actor frozen) or a ``joint_step`` (PPO policy loss, Eq. 14 with ε_ℓ=0.30 / ε_h=5.00, plus the max-form clipped value loss
   with ε_V=4.00), each role with its own AdamW chain (``make_optimizer``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rsi_jax.config import Config
from rsi_jax.models.actor import target_index
from rsi_jax.models.optim import TrainState, init_train_state, make_optimizer, make_train_step
from rsi_jax.rl.advantages import TBGAECarry, TBGAEResult, tb_gae
from rsi_jax.rl.batch import TrajectoryBatch
from rsi_jax.rl.losses import ppo_policy_loss, value_loss
from rsi_jax.rl.metrics import explained_variance, masked_token_mean

_DEVICE_FIELDS = ("tokens", "positions", "segment_ids", "gen_mask", "turn_ids", "rewards", "dones",
                  "row_mask", "next_row")  # sampler logprobs and weight versions stay on the host


def linked_tb_gae(values, batch: dict, gamma_turn: float, lambda_turn: float, links: int) -> TBGAEResult:
  """TB-GAE where row i continues into row ``next_row[i]`` (the next segment of the same rollout).

  Each pass hands every row the carry of its continuation's first generated token; ``links`` passes resolve
  chains of up to ``links + 1`` segments exactly (the chunk-continuation identity, Eq. 12)."""
  gen = batch["gen_mask"]
  res = tb_gae(values, batch["rewards"], batch["turn_ids"], gen, batch["dones"], gamma_turn, lambda_turn)
  nxt = batch["next_row"]
  has_next = nxt >= 0
  nxt_c = jnp.where(has_next, nxt, 0)
  next_gen = gen[nxt_c].sum(-1) > 0
  first = jnp.argmax(gen > 0, axis=1)  # first generated position of each row
  take = lambda a: a[nxt_c, first[nxt_c]]
  # a continuation without generated tokens (its first call was rejected) passes its own carry through
  inherit = has_next & ~next_gen
  carry = None
  for _ in range(links):
    own = TBGAECarry(value=take(values).astype(jnp.float32), advantage=take(res.advantages),
                     turn_id=take(batch["turn_ids"]).astype(jnp.int32), present=has_next & next_gen)
    if carry is not None:
      own = jax.tree.map(lambda o, c: jnp.where(inherit, c[nxt_c], o), own, carry)
    carry = own
    res = tb_gae(values, batch["rewards"], batch["turn_ids"], gen, batch["dones"], gamma_turn, lambda_turn,
                 carry=carry)
  return res


def to_device_batch(batch: TrajectoryBatch) -> dict:
  """The arrays the jitted steps read, as a dict (the sampler logprobs stay on the host), with
  ``loss_index``: the generated positions, the only ones whose log-probabilities the losses read."""
  return {**{k: jnp.asarray(getattr(batch, k)) for k in _DEVICE_FIELDS},
          "loss_index": jnp.asarray(target_index(batch.gen_mask))}


def chain_links(batch: TrajectoryBatch) -> int:
  """Longest chain of continued segments minus one (static: the number of carry passes to compile)."""
  depth = 0
  for i in range(len(batch.next_row)):
    d, j = 0, int(batch.next_row[i])
    while j >= 0:
      d, j = d + 1, int(batch.next_row[j])
    depth = max(depth, d)
  return depth


@dataclasses.dataclass
class RPRTrainer:
  """Actor + critic PPO updates for one phase (one config: its learning rates, clips, clocks)."""
  cfg: Config
  actor: object  # rsi_jax.models.Actor
  critic: object  # rsi_jax.models.Critic

  def __post_init__(self):
    rl = self.cfg.rl
    self.actor_opt = make_optimizer(self.cfg.actor_optim)
    self.critic_opt = make_optimizer(self.cfg.critic_optim)
    logp_fn = self.actor.token_logprobs_fn()
    values_fn = self.critic.values_fn()

    def prepare(actor_params, critic_params, batch, links):
      args = (batch["tokens"], batch["positions"], batch["segment_ids"])
      old_logp = logp_fn(actor_params, *args, index=batch["loss_index"])  # 0 off the generated tokens
      old_values = values_fn(critic_params, *args)
      res = linked_tb_gae(old_values, batch, rl.gamma_turn, rl.lambda_turn, links)
      # the critic's fit before this step's updates (explained variance of the values TB-GAE used)
      ev = explained_variance(old_values, res.returns, batch["gen_mask"])
      return {"old_logp": old_logp, "old_values": old_values, "advantages": res.advantages,
              "returns": res.returns, "explained_variance": ev}

    self._prepare = jax.jit(prepare, static_argnums=3)

    def value_part(critic_params, batch):
      v = values_fn(critic_params, batch["tokens"], batch["positions"], batch["segment_ids"])
      return value_loss(v, batch["old_values"], batch["returns"], batch["gen_mask"], clip=rl.value_clip)

    def critic_loss(actor_params, critic_params, batch):
      del actor_params
      loss, m = value_part(critic_params, batch)
      return loss, {f"value/{k}": x for k, x in m.items()}

    def joint_loss(actor_params, critic_params, batch):
      logp = logp_fn(actor_params, batch["tokens"], batch["positions"], batch["segment_ids"],
                     index=batch["loss_index"])
      l_pi, m_pi = ppo_policy_loss(logp, batch["old_logp"], batch["advantages"], batch["gen_mask"],
                                   clip_low=rl.clip_low, clip_high=rl.clip_high)
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

  def step(self, state: TrainState, batch: TrajectoryBatch, train_actor: bool, version: int | None = None):
    """One rollout step's updates: π_old, v_old and TB-GAE once, then ``rl.ppo_epochs`` passes of
    ``rl.minibatches`` updates over a fixed shuffle of the rows. Returns (state, metrics): means over the
    updates, except ``policy/ratio_min`` / ``ratio_max`` (extremes over the step), the update counts, and the
    explained variance of the pre-update values. ``version``: the weight version of ``state.actor``; tokens
    sampled by it give the implementation mismatch (``mismatch/*``), older ones the policy drift
    (``drift/*``) and the staleness. ``state`` is donated: use the returned one."""
    if train_actor and state.actor_opt is None:
      raise ValueError("joint step with a frozen-actor state: call start_actor(state) first")
    rl = self.cfg.rl
    rows = len(batch.row_mask)
    if rows % rl.minibatches:
      raise ValueError(f"batch of {rows} rows does not split into rl.minibatches={rl.minibatches}")
    dev = to_device_batch(batch)
    prep = self._prepare(state.actor, state.critic, dev, chain_links(batch))
    ev = prep.pop("explained_variance")
    full = {**dev, **prep}
    fn = self._joint_step if train_actor else self._critic_step
    order = np.random.default_rng(int(state.step)).permutation(rows).reshape(rl.minibatches, -1)
    updates = []
    for _ in range(rl.ppo_epochs):
      for idx in order:
        idx = jnp.asarray(np.sort(idx))
        state, loss, aux = fn(state, {k: v[idx] for k, v in full.items()})
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
                   **{"value/explained_variance": float(ev)},
                   advantage_mean=float(masked_token_mean(prep["advantages"], dev["gen_mask"])),
                   return_mean=float(masked_token_mean(prep["returns"], dev["gen_mask"])))
    return state, metrics


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
