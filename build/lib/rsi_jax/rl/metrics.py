"""Masked reductions shared by the losses and the training logs.

All take ``(B, T)`` arrays and a ``(B, T)`` mask (bool or 0/1). Values at mask = 0 are never read (they may
be NaN or ±inf, as padding often is), and the gradient into them is exactly 0.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def _mask(mask):
  return jnp.asarray(mask).astype(bool)


def masked_sample_mean(x, mask):
  """Sample-level mean E_j (paper §2.4, before Eq. 14): mean over each row's masked tokens, then mean over
  the rows that have at least one masked token. Rows with no masked token are excluded; a batch with none
  at all gives 0 (not NaN). Returns a float32 scalar."""
  chex.assert_equal_shape([x, mask])
  m = _mask(mask)
  x = jnp.where(m, jnp.asarray(x, jnp.float32), 0.0)
  n = m.sum(axis=-1)
  row_mean = x.sum(axis=-1) / jnp.maximum(n, 1)
  has = n > 0
  return jnp.sum(jnp.where(has, row_mean, 0.0)) / jnp.maximum(has.sum(), 1)


def masked_token_mean(x, mask):
  """Mean over all masked tokens of the batch (token-level; used for monitoring). 0 if none."""
  m = _mask(mask)
  x = jnp.where(m, jnp.asarray(x, jnp.float32), 0.0)
  return x.sum() / jnp.maximum(m.sum(), 1)


def masked_min(x, mask, empty=0.0):
  m = _mask(mask)
  return jnp.where(m.any(), jnp.min(jnp.where(m, jnp.asarray(x, jnp.float32), jnp.inf)), empty)


def masked_max(x, mask, empty=0.0):
  m = _mask(mask)
  return jnp.where(m.any(), jnp.max(jnp.where(m, jnp.asarray(x, jnp.float32), -jnp.inf)), empty)


def explained_variance(values, returns, mask):
  """1 − Var(Ĝ − V) / Var(Ĝ) over the masked tokens of the whole batch (token-level, population variance).

  1 means the critic predicts the targets exactly, 0 means no better than their mean, < 0 worse (App. C,
  Eq. 17 gives the decomposition). Undefined when the masked targets have zero variance (or there are
  fewer than two masked tokens): then 0 is returned, not NaN, so that logs stay aggregable. Float32
  scalar, no gradient.
  """
  chex.assert_equal_shape([values, returns, mask])
  m = _mask(mask)
  v = jax.lax.stop_gradient(jnp.where(m, jnp.asarray(values, jnp.float32), 0.0))
  g = jax.lax.stop_gradient(jnp.where(m, jnp.asarray(returns, jnp.float32), 0.0))

  def var(x):
    mu = masked_token_mean(x, m)
    return masked_token_mean(jnp.square(x - mu), m)

  var_g = var(g)
  defined = (var_g > 0) & (m.sum() > 1)
  return jnp.where(defined, 1.0 - var(g - v) / jnp.where(defined, var_g, 1.0), 0.0)


def reward_outside_mask(rewards, mask):
  """(B,) total |r̃| placed on positions with mask = 0, which GAE / TB-GAE never read.

  A reward on an observation or padding token is silently dropped by credit assignment (a known failure of
  RL stacks). :func:`rsi_jax.rl.batch.assemble_batch` places rewards on generated tokens by construction;
  hand-built batches can be checked with this (it must be 0 everywhere).
  """
  m = _mask(mask)
  return jnp.sum(jnp.where(m, 0.0, jnp.abs(jnp.asarray(rewards, jnp.float32))), axis=-1)
