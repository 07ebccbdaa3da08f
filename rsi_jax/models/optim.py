"""Per-role optimizers and a jitted, sharded train step (paper App. A: AdamW, constant LR, global-norm clip)."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from rsi_jax.config import OptimConfig


def make_optimizer(optim_cfg: OptimConfig) -> optax.GradientTransformation:
  """clip_by_global_norm(grad_clip) -> AdamW(lr, b1, b2, eps, weight_decay); one chain per role.

  Weight decay applies to the weight matrices and embeddings; norm scales and biases are exempt unless
  ``decay_norms_and_biases`` (Megatron's default, the stack the paper trained with). The rate follows
  :func:`learning_rate_schedule`."""
  return optax.chain(
      optax.clip_by_global_norm(optim_cfg.grad_clip),
      optax.adamw(learning_rate_schedule(optim_cfg), b1=optim_cfg.b1, b2=optim_cfg.b2, eps=optim_cfg.eps,
                  weight_decay=optim_cfg.weight_decay,
                  mask=None if optim_cfg.decay_norms_and_biases else decay_mask),
  )


def learning_rate_schedule(o: OptimConfig) -> float | optax.Schedule:
  """The rate by update: ``learning_rate`` itself when constant without warmup (the paper's; the optimizer state
  then holds no count of its own, as before schedules were configurable), else an optax schedule: a linear warmup
  from 0 over ``warmup_steps``, then constant or a cosine decay to ``final_lr_fraction`` × the rate at update
  ``decay_steps``."""
  if o.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, o.learning_rate, o.warmup_steps, o.decay_steps,
                                              end_value=o.learning_rate * o.final_lr_fraction)
  if o.warmup_steps:
    return optax.join_schedules([optax.linear_schedule(0.0, o.learning_rate, o.warmup_steps),
                                 optax.constant_schedule(o.learning_rate)], [o.warmup_steps])
  return o.learning_rate


def decay_mask(params):
  """True for the leaves weight decay applies to: not norm scales (``.../scale``, ``..._norm/...``) and not
  biases (``.../bias``)."""
  def decays(path, _):
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    return not (names and names[-1] in ("scale", "bias") or any("norm" in n for n in names))
  return jax.tree_util.tree_map_with_path(decays, params)


class TrainState(NamedTuple):
  """Weights and optimizer state of the roles being trained. ``critic``/``critic_opt`` are None for actor-only
  steps; ``actor_opt`` is None when the actor is frozen."""
  actor: Any
  actor_opt: Any
  critic: Any = None
  critic_opt: Any = None
  step: jax.Array | int = 0


def opt_state_shardings(optimizer: optax.GradientTransformation, params_abstract, param_shardings, mesh):
  """Shardings of ``optimizer.init(params)``: moments follow their parameter, scalars are replicated."""
  abstract = jax.eval_shape(optimizer.init, params_abstract)
  flat_params = {tuple(p): s for p, s in jax.tree_util.tree_flatten_with_path(param_shardings)[0]}
  rep = NamedSharding(mesh, PartitionSpec())

  def pick(path, leaf):
    # moments (mu / nu) carry the param tree as a suffix of their path
    for n in range(len(path)):
      s = flat_params.get(tuple(path[n:]))
      if s is not None:
        return s
    return rep

  return jax.tree_util.tree_map_with_path(pick, abstract)


def init_opt_state(optimizer, params, shardings):
  return jax.jit(optimizer.init, out_shardings=shardings)(params)


def make_train_step(actor, optimizer, loss_fn: Callable, critic=None, critic_optimizer=None,
                    train_actor: bool = True, train_critic: bool = True, donate: bool = True,
                    has_signal: Callable | None = None) -> TrainStep:
  """A jitted step ``(state: TrainState, batch) -> (state, loss, aux)``, sharded like the params.

  ``loss_fn(actor_params, critic_params, batch) -> (loss, aux)`` is differentiated with respect to the
  trained roles (the actor's and/or the critic's params; pass a critic only for joint / critic steps). The
  loss usually calls ``actor.token_logprobs_fn()`` and ``critic.values_fn()``. Output shardings equal the
  input shardings, so repeated calls with same-shaped batches reuse one compiled program. An update whose
  loss or gradient norm is not finite is skipped (state kept, ``aux["skipped"] = 1``). ``has_signal(batch)``
  (a traced boolean, e.g. "some token is trainable"): False makes no update either (AdamW would still move
  the weights through its moments and weight decay; ``aux["empty"] = 1``).

  :meth:`TrainStep.accumulate` makes one update from several micro-batches (gradient accumulation).
  """
  return TrainStep(actor, optimizer, loss_fn, critic, critic_optimizer, train_actor, train_critic, donate,
                   has_signal)


class TrainStep:
  """See :func:`make_train_step`. Calling it runs the fused single-batch step."""

  def __init__(self, actor, optimizer, loss_fn, critic, critic_optimizer, train_actor, train_critic, donate,
               has_signal):
    mesh = actor.mesh
    rep = NamedSharding(mesh, PartitionSpec())
    a_opt_sh = opt_state_shardings(optimizer, actor.abstract_params, actor.param_shardings, mesh) \
        if train_actor else None
    c_sh = critic.param_shardings if critic is not None else None
    c_opt_sh = opt_state_shardings(critic_optimizer, critic.abstract_params, c_sh, mesh) \
        if critic is not None and train_critic else None
    state_sh = TrainState(actor.param_shardings, a_opt_sh, c_sh, c_opt_sh, rep)
    argnums = tuple(i for i, on in ((0, train_actor), (1, train_critic and critic is not None)) if on)
    grad_sh = {0: actor.param_shardings, 1: c_sh}
    grad_sh = {i: grad_sh[i] for i in argnums}

    def grads_of(state: TrainState, batch):
      (loss, aux), grads = jax.value_and_grad(lambda a, c: loss_fn(a, c, batch), argnums=argnums,
                                              has_aux=True)(state.actor, state.critic)
      return loss, aux, dict(zip(argnums, grads))

    def update(state: TrainState, grads: dict, loss, aux, signal):
      actor_p, actor_o, critic_p, critic_o = state.actor, state.actor_opt, state.critic, state.critic_opt
      finite = jnp.isfinite(loss)
      if 0 in grads:
        upd, actor_o = optimizer.update(grads[0], actor_o, actor_p)
        actor_p = optax.apply_updates(actor_p, upd)
        aux = dict(aux, actor_grad_norm=optax.global_norm(grads[0]))
        finite &= jnp.isfinite(aux["actor_grad_norm"])
      if 1 in grads:
        upd, critic_o = critic_optimizer.update(grads[1], critic_o, critic_p)
        critic_p = optax.apply_updates(critic_p, upd)
        aux = dict(aux, critic_grad_norm=optax.global_norm(grads[1]))
        finite &= jnp.isfinite(aux["critic_grad_norm"])
      # Invariant: a non-finite loss or gradient never touches the weights or the optimizer moments; the
      # update is skipped (weights and optimizer state kept bit for bit) and reported as aux["skipped"] = 1.
      new = (actor_p, actor_o, critic_p, critic_o)
      old = (state.actor, state.actor_opt, state.critic, state.critic_opt)
      kept = jax.tree.map(lambda n, o: jnp.where(finite & signal, n, o), new, old)
      aux = dict(aux, skipped=(signal & ~finite).astype(jnp.float32), empty=(~signal).astype(jnp.float32))
      return TrainState(*kept, state.step + 1), loss, aux

    def step(state: TrainState, batch):
      loss, aux, grads = grads_of(state, batch)
      signal = jnp.asarray(True) if has_signal is None else jnp.asarray(has_signal(batch), bool)
      return update(state, grads, loss, aux, signal)

    donate_state = (0,) if donate else ()
    self._step = jax.jit(step, out_shardings=(state_sh, rep, rep), donate_argnums=donate_state)
    f32 = lambda g: jax.tree.map(lambda x: x.astype(jnp.float32), g)
    self._grads = jax.jit(lambda state, batch: (lambda l, a, g: (l, a, f32(g)))(*grads_of(state, batch)),
                          out_shardings=(rep, rep, grad_sh))
    self._add = jax.jit(lambda acc, g: jax.tree.map(jnp.add, acc, g), out_shardings=grad_sh,
                        donate_argnums=(0,))
    self._update = jax.jit(update, out_shardings=(state_sh, rep, rep), donate_argnums=donate_state)
    self._has_signal = has_signal

  def __call__(self, state: TrainState, batch):
    return self._step(state, batch)

  def _cache_size(self) -> int:
    """Compiled executables of the fused step (one per batch shape)."""
    return self._step._cache_size()

  def accumulate(self, state: TrainState, batches: list, combine: Callable | None = None):
    """One optimizer update from the summed gradients (float32) of ``batches`` (micro-batches, one forward
    and backward pass each, of any shapes): the loss must be normalised by the whole update's sample / token
    counts, so that the micro-batches' losses sum to the update's. Returns (state, loss, aux) as a call does;
    ``aux``: ``combine(list of each pass's aux)`` (default: the first pass's), plus grad norms and counts.
    One batch runs the fused step."""
    if not batches:
      raise ValueError("accumulate: no micro-batch")
    if len(batches) == 1:
      state, loss, aux = self._step(state, batches[0])
      return state, loss, (combine([aux]) if combine else aux) | {k: aux[k] for k in aux if k.endswith(
          ("grad_norm", "skipped", "empty"))}
    loss, acc, auxes, signal = 0.0, None, [], False
    for b in batches:
      l, a, g = self._grads(state, b)
      acc = g if acc is None else self._add(acc, g)
      loss = loss + l
      auxes.append(a)
      signal = signal or self._has_signal is None or bool(self._has_signal(b))
    aux = combine(auxes) if combine else auxes[0]
    return self._update(state, acc, jnp.asarray(loss, jnp.float32), aux, jnp.asarray(signal))


def init_train_state(actor, optimizer, actor_params, critic=None, critic_optimizer=None, critic_params=None,
                     train_actor: bool = True, train_critic: bool = True) -> TrainState:
  """A TrainState with optimizer states created in their shardings."""
  a_opt = None
  if train_actor:
    sh = opt_state_shardings(optimizer, actor.abstract_params, actor.param_shardings, actor.mesh)
    a_opt = init_opt_state(optimizer, actor_params, sh)
  c_opt = None
  if critic is not None and train_critic:
    sh = opt_state_shardings(critic_optimizer, critic.abstract_params, critic.param_shardings, actor.mesh)
    c_opt = init_opt_state(critic_optimizer, critic_params, sh)
  # the step counter lives where the step function returns it (replicated), so step 2 hits step 1's cache
  step = jax.device_put(jnp.zeros((), jnp.int32), NamedSharding(actor.mesh, PartitionSpec()))
  return TrainState(actor_params, a_opt, critic_params, c_opt, step)


def masked_nll_loss(actor, normalize: str = "per_sample"):
  """The RSR SFT loss (paper Eq. 3 via :func:`rsi_jax.rl.losses.sft_loss`; ``normalize`` as documented
  there) as a train-step loss. Batch dict: tokens, positions, segment_ids (packed rows: one id per sample),
  mask (generated decisions), and optionally loss_index (:func:`rsi_jax.models.actor.target_index` of the
  mask) and num_samples / num_tokens (the whole update's, when it accumulates micro-batches)."""
  from rsi_jax.rl.losses import sft_loss
  logprobs = actor.token_logprobs_fn()

  def loss_fn(actor_params, critic_params, batch):
    lp = logprobs(actor_params, batch["tokens"], batch["positions"], batch["segment_ids"],
                  index=batch.get("loss_index"))  # with it, the LM head runs on the generated tokens only
    loss, m = sft_loss(lp, batch["mask"].astype(jnp.float32), normalize=normalize,
                       segment_ids=batch["segment_ids"], num_samples=batch.get("num_samples"),
                       num_tokens=batch.get("num_tokens"))
    return loss, {"nll_per_token": m["nll_per_token"], "num_tokens": m["num_tokens"]}

  return loss_fn
