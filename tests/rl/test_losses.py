"""PPO / value / SFT losses (Eq. 14, Eq. 3) and explained variance against numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsi_jax.rl import explained_variance, ppo_policy_loss, sft_loss, value_loss
from rsi_jax.rl.metrics import masked_sample_mean, reward_outside_mask

B, T = 5, 12
SETTINGS = settings(max_examples=60, deadline=None)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy references meet the NaN padding
PPO = jax.jit(ppo_policy_loss)
VAL = jax.jit(value_loss)
PPO_GRAD = jax.jit(jax.grad(lambda *a: ppo_policy_loss(*a)[0]))
VAL_GRAD = jax.jit(jax.grad(lambda *a: value_loss(*a)[0]))


# ------------------------------------------------------------------------------------------ references


def np_sample_mean(x, mask):
  """E_j: per-row mean over masked tokens, then mean over rows with ≥ 1 masked token (paper §2.4)."""
  rows = [x[b][mask[b]].mean() for b in range(x.shape[0]) if mask[b].any()]
  return float(np.mean(rows)) if rows else 0.0


def np_ppo(logp, old, adv, mask, lo=0.3, hi=5.0):
  ratio = np.exp(np.where(mask, logp - old, 0.0))
  surr = np.minimum(ratio * adv, np.clip(ratio, 1 - lo, 1 + hi) * adv)
  return -np_sample_mean(surr, mask)


def np_ppo_grad(logp, old, adv, mask, lo=0.3, hi=5.0):
  """d L_π / d logp: −ρA / (n_b · N) where the unclipped term is the minimum, 0 where the clip binds."""
  ratio = np.exp(np.where(mask, logp - old, 0.0))
  n_rows = max(int(mask.any(axis=1).sum()), 1)
  clipped = ((adv > 0) & (ratio > 1 + hi)) | ((adv < 0) & (ratio < 1 - lo))
  g = np.where(mask & ~clipped, -ratio * adv, 0.0)
  return g / np.maximum(mask.sum(axis=1, keepdims=True), 1) / n_rows


def np_value(v, old, ret, mask, eps=4.0):
  v_clip = old + np.clip(v - old, -eps, eps)
  return np_sample_mean(np.maximum((v - ret) ** 2, (v_clip - ret) ** 2), np.asarray(mask, bool))


def np_value_grad(v, old, ret, mask, eps=4.0):
  v_clip = old + np.clip(v - old, -eps, eps)
  e, ec = (v - ret) ** 2, (v_clip - ret) ** 2
  inside = np.abs(v - old) <= eps  # V̄ = V, both terms equal
  g = np.where(inside | (e >= ec), 2 * (v - ret), 0.0)  # the clipped term has zero slope outside
  n_rows = max(int(mask.any(axis=1).sum()), 1)
  return np.where(mask, g, 0.0) / np.maximum(mask.sum(axis=1, keepdims=True), 1) / n_rows


def np_explained_variance(v, g, mask):
  gm, vm = g[mask], v[mask]
  return 1.0 - np.var(gm - vm) / np.var(gm)


@st.composite
def loss_batches(draw):
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  mask = rng.random((B, T)) < draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
  mask[rng.random(B) < 0.3] = False  # some rows with no masked token at all
  log_ratio_scale = draw(st.sampled_from([0.05, 0.5, 2.0]))  # from on-policy to far off-policy
  old = -rng.exponential(2.0, (B, T)).astype(np.float32)
  logp = (old + rng.normal(0, log_ratio_scale, (B, T))).astype(np.float32)
  adv = rng.normal(0, 2, (B, T)).astype(np.float32)
  v_old = rng.normal(0, 3, (B, T)).astype(np.float32)
  v = (v_old + rng.normal(0, draw(st.sampled_from([0.5, 5.0])), (B, T))).astype(np.float32)
  ret = rng.normal(0, 5, (B, T)).astype(np.float32)
  # Padding garbage that must never be read.
  for x in (logp, old, adv, v, v_old, ret):
    x[~mask] = rng.choice([np.nan, np.inf, -np.inf, 1e30], size=int((~mask).sum()))
  return logp, old, adv, v, v_old, ret, mask


# ------------------------------------------------------------------------------------------ policy


@SETTINGS
@given(batch=loss_batches())
def test_ppo_loss_and_gradient_match_numpy(batch):
  logp, old, adv, _, _, _, mask = batch
  loss, m = PPO(logp, old, adv, mask)
  np.testing.assert_allclose(loss, np_ppo(logp, old, adv, mask), rtol=1e-5, atol=1e-6)
  grad = PPO_GRAD(logp, old, adv, mask)
  assert np.isfinite(grad).all() and not np.asarray(grad)[~mask].any()
  np.testing.assert_allclose(grad, np_ppo_grad(logp, old, adv, mask), rtol=1e-5, atol=1e-7)
  for k, val in m.items():
    assert np.isfinite(val), k
  assert m["num_tokens"] == mask.sum() and m["num_samples"] == mask.any(axis=1).sum()
  if mask.any():
    ratio = np.exp(logp - old)[mask]
    np.testing.assert_allclose([m["ratio_min"], m["ratio_mean"], m["ratio_max"]],
                               [ratio.min(), ratio.mean(), ratio.max()], rtol=1e-5)
    np.testing.assert_allclose(m["approx_kl"], np.mean(ratio - 1 - np.log(ratio)), rtol=1e-4, atol=1e-6)
    a = adv[mask]
    np.testing.assert_allclose(m["clip_frac_high"], np.mean((a > 0) & (ratio > 6.0)), atol=1e-6)
    np.testing.assert_allclose(m["clip_frac_low"], np.mean((a < 0) & (ratio < 0.7)), atol=1e-6)


def test_ppo_asymmetric_clip_region():
  # One token per row: (ρ, A) at each corner of the clip region, thresholds 1 − 0.3 = 0.7 and 1 + 5 = 6.
  cases = [  # ratio, advantage, surrogate, clipped (zero gradient)
      (7.0, 1.0, 6.0, True),  # A > 0, ρ > 6: capped at 6A
      (7.0, -1.0, -7.0, False),  # A < 0, ρ > 6: unclipped ρA (the clip does not bound a bad ratio)
      (0.5, -1.0, -0.7, True),  # A < 0, ρ < 0.7: capped at 0.7A
      (0.5, 1.0, 0.5, False),  # A > 0, ρ < 0.7: unclipped
      (5.5, 2.0, 11.0, False),  # inside [0.7, 6]: unclipped
      (0.8, -2.0, -1.6, False),
  ]
  ratio = np.array([c[0] for c in cases], np.float32)[:, None]
  adv = np.array([c[1] for c in cases], np.float32)[:, None]
  old = np.full_like(ratio, -1.0)
  logp = old + np.log(ratio)
  mask = np.ones_like(ratio, bool)
  loss, m = ppo_policy_loss(logp, old, adv, mask)
  np.testing.assert_allclose(loss, -np.mean([c[2] for c in cases]), rtol=1e-5)
  grad = np.asarray(jax.grad(lambda lp: ppo_policy_loss(lp, old, adv, mask)[0])(logp))[:, 0]
  for (r, a, _, clipped), g in zip(cases, grad):
    if clipped:
      assert g == 0.0, (r, a)
    else:
      np.testing.assert_allclose(g, -r * a / len(cases), rtol=1e-5)
  np.testing.assert_allclose([m["clip_frac_high"], m["clip_frac_low"], m["clip_frac"]], [1 / 6, 1 / 6, 2 / 6],
                             rtol=1e-6)
  np.testing.assert_allclose([m["ratio_min"], m["ratio_max"]], [0.5, 7.0], rtol=1e-5)
  # The defaults are the paper's ε_ℓ = 0.30, ε_h = 5.00: passing them explicitly changes nothing.
  np.testing.assert_allclose(ppo_policy_loss(logp, old, adv, mask, 0.3, 5.0)[0], loss)


def test_ppo_sample_level_aggregation_weights_rows_not_tokens():
  # Row 0: one token with surrogate 1; row 1: three tokens with surrogate 0; row 2: empty (excluded).
  old = np.zeros((3, 3), np.float32)
  adv = np.array([[1, 9, 9], [0, 0, 0], [5, 5, 5]], np.float32)
  mask = np.array([[1, 0, 0], [1, 1, 1], [0, 0, 0]], bool)
  loss, m = ppo_policy_loss(old, old, adv, mask)
  np.testing.assert_allclose(loss, -0.5)  # not −1/4 (token mean) and not −1/3 (empty row counted)
  assert m["num_samples"] == 2 and m["num_tokens"] == 4


def test_losses_with_no_masked_token_are_zero_not_nan():
  x = np.full((2, 4), np.nan, np.float32)
  mask = np.zeros((2, 4), bool)
  for fn in (lambda a: ppo_policy_loss(a, a, a, mask), lambda a: value_loss(a, a, a, mask),
             lambda a: sft_loss(a, mask)):
    loss, m = fn(x)
    assert loss == 0.0
    assert all(np.isfinite(v) for v in m.values())
    g = jax.grad(lambda a: fn(a)[0])(x)
    assert np.all(np.asarray(g) == 0.0)


# ------------------------------------------------------------------------------------------- value


@SETTINGS
@given(batch=loss_batches())
def test_value_loss_and_gradient_match_numpy(batch):
  _, _, _, v, v_old, ret, mask = batch
  loss, m = VAL(v, v_old, ret, mask)
  np.testing.assert_allclose(loss, np_value(v, v_old, ret, mask), rtol=1e-5, atol=1e-5)
  grad = VAL_GRAD(v, v_old, ret, mask)
  assert np.isfinite(grad).all() and not np.asarray(grad)[~mask].any()
  np.testing.assert_allclose(grad, np_value_grad(v, v_old, ret, mask), rtol=1e-5, atol=1e-6)
  for k, val in m.items():
    assert np.isfinite(val), k
  if mask.any():
    np.testing.assert_allclose(m["value_clip_frac"], np.mean(np.abs(v - v_old)[mask] > 4.0), atol=1e-6)


def test_value_loss_max_form_clip_cases():
  # v_old = 0, ε_V = 4: V̄ = clip(V, −4, 4).
  cases = [  # V, Ĝ, loss term, gradient dL/dV (per token, before averaging)
      (1.0, 3.0, 4.0, 2 * (1 - 3)),  # inside the clip range: plain squared error
      (6.0, 10.0, 36.0, 0.0),  # V̄ = 4 is further from Ĝ: the clipped term wins, no gradient
      (6.0, 0.0, 36.0, 12.0),  # V̄ = 4 is closer: unclipped term wins, gradient flows
      (-9.0, -20.0, 256.0, 0.0),  # V̄ = −4: (−4 + 20)² = 256 > 121
      (-9.0, 5.0, 196.0, 2 * (-9 - 5)),
  ]
  v = np.array([[c[0]] for c in cases], np.float32)
  ret = np.array([[c[1]] for c in cases], np.float32)
  old = np.zeros_like(v)
  mask = np.ones_like(v, bool)
  loss, m = value_loss(v, old, ret, mask)
  np.testing.assert_allclose(loss, np.mean([c[2] for c in cases]), rtol=1e-6)  # no ½ factor
  grad = np.asarray(jax.grad(lambda x: value_loss(x, old, ret, mask)[0])(v))[:, 0]
  np.testing.assert_allclose(grad, [c[3] / len(cases) for c in cases], rtol=1e-6)
  np.testing.assert_allclose(m["value_clip_frac"], 4 / 5)
  np.testing.assert_allclose(m["value_clip_active_frac"], 2 / 5)


# --------------------------------------------------------------------------------------------- SFT


def test_sft_loss_normalizations():
  logp = np.array([[-1.0, -2.0, -3.0], [-4.0, 0.0, 0.0], [-7.0, -7.0, -7.0]], np.float32)
  mask = np.array([[1, 1, 1], [1, 0, 0], [0, 0, 0]], bool)
  total = 1 + 2 + 3 + 4
  want = {"sum": total, "per_sample": total / 2, "per_token": total / 4, "sample_mean": (2 + 4) / 2}
  for norm, w in want.items():
    loss, m = sft_loss(logp, mask, normalize=norm)
    np.testing.assert_allclose(loss, w, rtol=1e-6)
    np.testing.assert_allclose(m["nll_per_token"], total / 4, rtol=1e-6)
  assert sft_loss(logp, mask)[0] == sft_loss(logp, mask, normalize="per_sample")[0]  # Eq. 3's estimate
  g = jax.grad(lambda x: sft_loss(x, mask, normalize="sum")[0])(logp)
  np.testing.assert_array_equal(g, -mask.astype(np.float32))  # −Σ m_j log π: each masked token weight 1
  with pytest.raises(ValueError, match="normalize"):
    sft_loss(logp, mask, normalize="mean")


# ------------------------------------------------------------------------------------------ metrics


@SETTINGS
@given(batch=loss_batches())
def test_explained_variance_matches_numpy(batch):
  _, _, _, v, _, ret, mask = batch
  ev = explained_variance(v, ret, mask)
  if mask.sum() > 1 and np.var(ret[mask]) > 0:
    np.testing.assert_allclose(ev, np_explained_variance(v, ret, mask), rtol=1e-4, atol=1e-5)
  else:
    assert ev == 0.0


def test_explained_variance_edge_cases():
  g = np.array([[1.0, 2.0, 3.0, 99.0]], np.float32)
  mask = np.array([[1, 1, 1, 0]], bool)
  np.testing.assert_allclose(explained_variance(g, g, mask), 1.0)  # a perfect critic
  np.testing.assert_allclose(explained_variance(np.full_like(g, 2.0), g, mask), 0.0, atol=1e-6)  # the mean
  assert explained_variance(g, np.ones_like(g), mask) == 0.0  # constant targets: undefined → 0


def test_masked_sample_mean_and_reward_outside_mask():
  x = np.array([[1.0, 3.0, np.nan], [5.0, np.inf, 0.0]], np.float32)
  mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
  np.testing.assert_allclose(masked_sample_mean(x, mask), (2.0 + 5.0) / 2)
  r = np.array([[0.0, 0.5, -2.0], [1.0, 0.0, 0.0]], np.float32)
  np.testing.assert_allclose(reward_outside_mask(r, mask), [2.0, 0.0])


def test_losses_jit_and_vmap():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, B, T)).astype(np.float32)
  mask = rng.random((3, B, T)) < 0.5
  out = jax.jit(jax.vmap(lambda a, m: value_loss(a, a * 0.5, a + 1, m)[0]))(x, mask)
  for i in range(3):
    np.testing.assert_allclose(out[i], value_loss(x[i], x[i] * 0.5, x[i] + 1, mask[i])[0], rtol=1e-6)
  assert ppo_policy_loss(x[0].astype(jnp.bfloat16), x[0], x[0], mask[0])[0].dtype == jnp.float32


def test_targets_are_detached():
  # Eq. 14 uses detached π_old, A_j, v_j and Ĝ_j: no gradient reaches them, even if a caller passes traced
  # arrays that depend on the parameters being trained.
  rng = np.random.default_rng(1)
  x = [rng.normal(size=(B, T)).astype(np.float32) for _ in range(3)]
  mask = rng.random((B, T)) < 0.7
  g = jax.grad(lambda a, b, c: ppo_policy_loss(a, b, c, mask)[0], argnums=(0, 1, 2))(*x)
  assert np.abs(g[0]).sum() > 0 and not np.asarray(g[1]).any() and not np.asarray(g[2]).any()
  g = jax.grad(lambda a, b, c: value_loss(a, b + 3 * a, c, mask)[0], argnums=(0, 1, 2))(*x)
  assert not np.asarray(g[1]).any() and not np.asarray(g[2]).any()
  np.testing.assert_allclose(g[0], jax.grad(lambda a: value_loss(a, x[1] + 3 * x[0], x[2], mask)[0])(x[0]))
