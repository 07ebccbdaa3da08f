"""RPR and RSR objectives (paper §2.1 Eq. 3, §2.4 Eq. 14, App. A; SPEC §3).

Every loss takes ``(B, T)`` token arrays and a ``(B, T)`` mask of the positions it trains on (the generated
decisions, ``gen_mask``), returns ``(loss, metrics)`` with a float32 scalar loss and a dict of float32
scalars, and is jittable and differentiable. Inputs at mask = 0 are never read and receive zero gradient, so
padding may hold anything (NaN, ±inf) without poisoning the loss or its gradient.

Aggregation (Eq. 14's E_j) is **sample-level**: mean over each sample's masked tokens, then mean over the
samples with ≥ 1 masked token (samples with none are excluded, not counted as zero). A sample is a row, or,
for packed rows, a segment of a row (``segment_ids``: 1, 2, ... per sample, 0 on padding); ``num_samples``
replaces the counted denominator (a micro-batch's share of a minibatch: the micro-batches' losses and
gradients then sum to the whole minibatch's). Monitoring metrics (clip fractions, ratio statistics,
approximate KL) are token-level over all masked tokens of the batch.

The targets — ``old_logp``, ``advantages``, ``old_values``, ``returns`` — are detached here
(``stop_gradient``): the paper uses detached pre-update v_j, A_j and Ĝ_j (§2.4).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rsi_jax.rl.metrics import (explained_variance, masked_max, masked_min, masked_sample_mean,
                                masked_token_mean, sample_count)

SFT_NORMALIZATIONS = ("sum", "per_sample", "per_token", "sample_mean")


def _prep(mask, *xs):
  m = jnp.asarray(mask).astype(bool)
  # Zero the unmasked entries *before* any nonlinearity: exp(inf) · 0 would give NaN in the forward pass or
  # the gradient even though the value is masked out afterwards.
  return (m,) + tuple(jnp.where(m, jnp.asarray(x, jnp.float32), 0.0) for x in xs)


def ppo_policy_loss(logp, old_logp, advantages, mask, clip_low=0.3, clip_high=5.0, segment_ids=None,
                    num_samples=None):
  """Asymmetric-clip PPO surrogate, Eq. 14 (first line): L_π = −E_j min(ρ_j A_j, clip(ρ_j, 1−ε_ℓ, 1+ε_h) A_j).

  ρ_j = exp(logπ_θ − logπ_old). π_old is the training-side old actor's recomputation (not the sampler's
  logprobs). Defaults ε_ℓ = 0.30, ε_h = 5.00 give ratio thresholds 0.70 and 6.00. No KL or entropy term.
  The clip binds (zero gradient) for A > 0 with ρ > 1+ε_h and for A < 0 with ρ < 1−ε_ℓ; elsewhere the
  unclipped ρA is taken, whatever ρ is.

  Args:
    logp: (B, T) log π_θ(y_j | h_j) of the taken tokens (differentiated).
    old_logp: (B, T) log π_old (detached).
    advantages: (B, T) A_j (detached), e.g. from :func:`rsi_jax.rl.tb_gae`.
    mask: (B, T) 1 on trained positions.

  Returns:
    (loss, metrics). metrics: ``policy_loss``, ``clip_frac`` (share of masked tokens where the clip binds),
    ``clip_frac_high`` (A > 0, ρ > 1+ε_h), ``clip_frac_low`` (A < 0, ρ < 1−ε_ℓ), ``ratio_min``,
    ``ratio_mean``, ``ratio_max``, ``approx_kl`` (k3 estimate E[(ρ−1) − log ρ] of KL(π_old‖π_θ), for
    monitoring only), ``advantage_mean``, ``num_tokens``, ``num_samples``.
  """
  chex.assert_equal_shape([logp, old_logp, advantages, mask])
  m, logp, old_logp, adv = _prep(mask, logp, old_logp, advantages)
  old_logp = jax.lax.stop_gradient(old_logp)
  adv = jax.lax.stop_gradient(adv)
  log_ratio = logp - old_logp  # 0 where mask = 0
  ratio = jnp.exp(log_ratio)
  surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv)
  loss = -masked_sample_mean(surrogate, m, segment_ids, num_samples)

  r = jax.lax.stop_gradient(ratio)
  lr = jax.lax.stop_gradient(log_ratio)
  high = m & (adv > 0) & (r > 1.0 + clip_high)
  low = m & (adv < 0) & (r < 1.0 - clip_low)
  metrics = {
      "policy_loss": jax.lax.stop_gradient(loss),
      "clip_frac": masked_token_mean(high | low, m),
      "clip_frac_high": masked_token_mean(high, m),
      "clip_frac_low": masked_token_mean(low, m),
      "ratio_min": masked_min(r, m, empty=1.0),
      "ratio_mean": jnp.where(m.any(), masked_token_mean(r, m), 1.0),
      "ratio_max": masked_max(r, m, empty=1.0),
      "approx_kl": masked_token_mean((r - 1.0) - lr, m),
      "advantage_mean": masked_token_mean(adv, m),
      **_counts(m, segment_ids),
  }
  return loss, metrics


def value_loss(values, old_values, returns, mask, clip=4.0, segment_ids=None, num_samples=None):
  """Max-form clipped value loss, Eq. 14 (second line): L_V = E_j max{(V − Ĝ)², (V̄ − Ĝ)²}.

  V̄_j = v_j + clip(V_φ(h_j) − v_j, −ε_V, ε_V), with v_j the detached pre-update value (the one TB-GAE
  used) and ε_V = 4.00. No ½ factor.

  Args:
    values: (B, T) V_φ(h_j) under the current critic (differentiated).
    old_values: (B, T) v_j (detached).
    returns: (B, T) targets Ĝ_j (detached).
    mask: (B, T) 1 on trained positions.

  Returns:
    (loss, metrics). metrics: ``value_loss``, ``value_clip_frac`` (share of masked tokens with
    |V − v| > ε_V, where V̄ is clipped), ``value_clip_active_frac`` (share where the clipped term is the
    strictly larger one, so the token's gradient is zero), ``value_mean``, ``return_mean``,
    ``value_mse`` (unclipped E_j (V − Ĝ)²), ``explained_variance``, ``num_tokens``, ``num_samples``.
  """
  chex.assert_equal_shape([values, old_values, returns, mask])
  m, v, v_old, g = _prep(mask, values, old_values, returns)
  v_old = jax.lax.stop_gradient(v_old)
  g = jax.lax.stop_gradient(g)
  v_clipped = v_old + jnp.clip(v - v_old, -clip, clip)
  err = jnp.square(v - g)
  err_clipped = jnp.square(v_clipped - g)
  loss = masked_sample_mean(jnp.maximum(err, err_clipped), m, segment_ids, num_samples)

  vs = jax.lax.stop_gradient(v)
  metrics = {
      "value_loss": jax.lax.stop_gradient(loss),
      "value_clip_frac": masked_token_mean(jnp.abs(vs - v_old) > clip, m),
      "value_clip_active_frac": masked_token_mean(jax.lax.stop_gradient(err_clipped > err), m),
      "value_mean": masked_token_mean(vs, m),
      "return_mean": masked_token_mean(g, m),
      "value_mse": jax.lax.stop_gradient(masked_sample_mean(err, m, segment_ids, num_samples)),
      "explained_variance": explained_variance(vs, g, m),
      **_counts(m, segment_ids),
  }
  return loss, metrics


def sft_loss(logp, mask, normalize="per_sample", segment_ids=None, num_samples=None, num_tokens=None):
  """Masked negative log-likelihood for RSR replay, Eq. 3: L = −E_{Q_clean} Σ_j m_j log π_θ(y_j | h_j).

  Eq. 3 sums over a trajectory's generated decisions and averages over trajectories. ``normalize`` says how
  the batch sum S = Σ_{b,j} m_bj (−log π) is scaled:

  - ``"per_sample"`` (default): S / (#rows with ≥ 1 masked token) — the Monte Carlo estimate of Eq. 3 when
    each row holds one trajectory (long trajectories weigh more, as in Eq. 3).
  - ``"sum"``: S itself, Eq. 3's inner sum taken over the whole batch.
  - ``"per_token"``: S / (#masked tokens), the usual LM-SFT token mean (not Eq. 3: rescales by batch length).
  - ``"sample_mean"``: E_j as in Eq. 14 (per-row token mean, then mean over rows; not Eq. 3).

  Rows may pack several samples (``segment_ids``); ``num_samples`` / ``num_tokens`` replace the counted
  denominators (gradient accumulation: see the module docstring).

  Args:
    logp: (B, T) log π_θ of the target tokens (differentiated).
    mask: (B, T) m_j, 1 on generated decisions of accepted replay.

  Returns:
    (loss, metrics). metrics: ``sft_loss``, ``nll_per_token``, ``num_tokens``, ``num_samples``.
  """
  chex.assert_equal_shape([logp, mask])
  if normalize not in SFT_NORMALIZATIONS:
    raise ValueError(f"normalize must be one of {SFT_NORMALIZATIONS}, got {normalize!r}")
  m, logp = _prep(mask, logp)
  nll = -logp
  counts = _counts(m, segment_ids)
  total = jnp.sum(nll)
  den = lambda given, counted: jnp.maximum(counted if given is None else jnp.asarray(given, jnp.float32), 1.0)
  if normalize == "sum":
    loss = total
  elif normalize == "per_sample":
    loss = total / den(num_samples, counts["num_samples"])
  elif normalize == "per_token":
    loss = total / den(num_tokens, counts["num_tokens"])
  else:
    loss = masked_sample_mean(nll, m, segment_ids, num_samples)
  metrics = {
      "sft_loss": jax.lax.stop_gradient(loss),
      "nll_per_token": jax.lax.stop_gradient(masked_token_mean(nll, m)),
      **counts,
  }
  return loss, metrics


def _counts(m, segment_ids=None):
  return {"num_tokens": m.sum().astype(jnp.float32), "num_samples": sample_count(m, segment_ids)}
