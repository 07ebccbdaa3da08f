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


def masked_sample_mean(x, mask, segment_ids=None, num_samples=None):
  """Sample-level mean E_j (paper §2.4, before Eq. 14): mean over each sample's masked tokens, then mean
  over the samples that have at least one masked token. Samples with no masked token are excluded; a batch
  with none at all gives 0 (not NaN). Returns a float32 scalar.

  A sample is a row, or with ``segment_ids`` (B, T) (packed rows: 1, 2, ... per sample along a row, 0 on
  padding) a segment of a row. ``num_samples``: divide the sum of sample means by this instead of by the
  samples counted here (a micro-batch's share of a larger batch's mean, for gradient accumulation)."""
  chex.assert_equal_shape([x, mask])
  m = _mask(mask)
  x = jnp.where(m, jnp.asarray(x, jnp.float32), 0.0)
  if segment_ids is None:
    tot, n = x.sum(axis=-1), m.sum(axis=-1)
  else:
    tot, n = _per_segment(x, segment_ids), _per_segment(m.astype(jnp.int32), segment_ids)
  has = n > 0
  total = jnp.sum(jnp.where(has, tot / jnp.maximum(n, 1), 0.0))
  if num_samples is None:
    return total / jnp.maximum(has.sum(), 1)
  return total / jnp.maximum(jnp.asarray(num_samples, jnp.float32), 1.0)


def _per_segment(x, segment_ids):
  """Sums of (B, T) ``x`` per (row, segment id): a flat vector with an entry for every possible segment."""
  b, t = x.shape
  ids = jnp.arange(b)[:, None] * (t + 1) + jnp.asarray(segment_ids)
  return jax.ops.segment_sum(x.reshape(-1), ids.reshape(-1), num_segments=b * (t + 1))


def sample_count(mask, segment_ids=None):
  """Samples (rows, or row segments with ``segment_ids``) with at least one masked token, as float32."""
  m = _mask(mask)
  n = m.sum(axis=-1) if segment_ids is None else _per_segment(m.astype(jnp.int32), segment_ids)
  return (n > 0).sum().astype(jnp.float32)


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


def combine_pass_metrics(auxes) -> dict:
  """One update's metrics from the per-pass metrics of its micro-batches (gradient accumulation).

  Losses (keys ending in ``loss`` or ``value_mse``) are normalised by the whole update's counts, so they add
  up; ``num_tokens`` / ``num_samples`` add up; ``ratio_min`` / ``ratio_max`` take the extreme; every other
  metric (token-level means: clip fractions, KL, means, the per-pass explained variance) is averaged with
  the passes' token counts (``<prefix>/num_tokens``, or ``num_tokens``) as weights."""
  import numpy as np
  auxes = [{k: np.asarray(v) for k, v in jax.device_get(a).items()} for a in auxes]
  if len(auxes) == 1:
    return auxes[0]
  out = {}
  for k in auxes[0]:
    xs = np.stack([a[k] for a in auxes]).astype(np.float64)
    name = k.rsplit("/", 1)[-1]
    if name.endswith("loss") or name == "value_mse" or name in ("num_tokens", "num_samples"):
      out[k] = xs.sum()
    elif name.endswith("ratio_min"):
      out[k] = xs.min()
    elif name.endswith("ratio_max"):
      out[k] = xs.max()
    else:
      wk = f"{k.rsplit('/', 1)[0]}/num_tokens" if "/" in k else "num_tokens"
      w = np.stack([a[wk] for a in auxes]).astype(np.float64) if wk in auxes[0] else np.ones(len(xs))
      out[k] = (xs * w).sum() / w.sum() if w.sum() > 0 else xs.mean()
  return {k: np.float32(v) for k, v in out.items()}
