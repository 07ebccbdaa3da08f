"""Sampling on fixed logits over a small vocabulary (16) against the exact truncated distributions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rsi_jax.sampler.sampling import sample_tokens, token_key

V = 16
N = 40_000  # samples per distribution: the sampling error of the total variation is about 0.01


def exact_distribution(logits, temperature, top_k, top_p, V=V):
  """The target written out the slow obvious way: scale, keep the k best, then the smallest descending
  prefix whose mass reaches p, renormalise."""
  z = np.asarray(logits, np.float64) / temperature
  order = np.argsort(-z, kind="stable")
  keep = np.zeros(V, bool)
  keep[order[:top_k if top_k else V]] = True
  p = np.exp(z - z.max()) * keep
  p /= p.sum()
  if top_p < 1:
    mass, kept = 0.0, np.zeros(V, bool)
    for i in order:
      if not keep[i] or mass >= top_p:
        continue
      kept[i] = True
      mass += p[i]
    p = p * kept
    p /= p.sum()
  return p


def draw(logits, temperature, top_k, top_p, n=N, seed=0):
  keys = jax.random.split(jax.random.key(seed), n)
  batch = jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (n, len(logits)))
  tok, lp = jax.jit(sample_tokens)(batch, keys, jnp.full((n,), temperature, jnp.float32),
                                   jnp.full((n,), top_k, jnp.int32), jnp.full((n,), top_p, jnp.float32))
  return np.asarray(tok), np.asarray(lp)


LOGITS = np.random.default_rng(0).normal(size=V) * 1.5


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 1.0), (1.0, 0, 0.6), (1.3, 8, 0.8), (1.0, 1, 1.0)])
def test_frequencies_match_exact_truncated_distribution(temperature, top_k, top_p):
  tok, lp = draw(LOGITS, temperature, top_k, top_p)
  target = exact_distribution(LOGITS, temperature, top_k, top_p)
  freq = np.bincount(tok, minlength=V) / len(tok)
  assert np.all(freq[target == 0] == 0), "a truncated token was sampled"
  assert 0.5 * np.abs(freq - target).sum() < 0.02
  # Logprobs are the base model's, untouched by temperature and truncation.
  base = jax.nn.log_softmax(jnp.asarray(LOGITS, jnp.float32))
  np.testing.assert_allclose(lp, np.asarray(base)[tok], atol=1e-6)


def test_vocabulary_spanning_several_sampling_blocks():
  """700 entries (several blocks of the two-level inverse CDF), the kept tokens scattered over all of them."""
  v = 700
  logits = np.random.default_rng(2).normal(size=v) * 3.0
  tok, _ = draw(logits, 1.0, 40, 0.95, n=N)
  target = exact_distribution(logits, 1.0, 40, 0.95, V=v)
  freq = np.bincount(tok, minlength=v) / len(tok)
  assert np.all(freq[target == 0] == 0)
  assert len(np.unique(np.nonzero(target)[0] // 128)) > 2
  assert 0.5 * np.abs(freq - target).sum() < 0.03


def test_greedy_is_argmax_and_rows_are_independent():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(6, V)).astype(np.float32)
  keys = jax.vmap(token_key)(jax.random.split(jax.random.key(3), 6), jnp.arange(6))
  temp = jnp.asarray([0.0, 1.0, 0.5, 1.0, 0.0, 2.0], jnp.float32)
  top_k = jnp.asarray([0, 3, 0, 0, 5, 0], jnp.int32)
  top_p = jnp.asarray([1.0, 1.0, 0.5, 0.9, 0.3, 1.0], jnp.float32)
  tok, _ = sample_tokens(jnp.asarray(logits), keys, temp, top_k, top_p)
  np.testing.assert_array_equal(np.asarray(tok)[[0, 4]], logits[[0, 4]].argmax(-1))
  # Each row alone, and with the other rows shuffled around it, samples the same token.
  for i in range(6):
    alone, _ = sample_tokens(jnp.asarray(logits[i:i + 1]), keys[i:i + 1], temp[i:i + 1], top_k[i:i + 1],
                             top_p[i:i + 1])
    assert int(alone[0]) == int(tok[i])
  perm = np.array([3, 5, 0, 2, 1, 4])
  shuffled, _ = sample_tokens(jnp.asarray(logits[perm]), keys[perm], temp[perm], top_k[perm], top_p[perm])
  np.testing.assert_array_equal(np.asarray(shuffled), np.asarray(tok)[perm])


def test_first_argmax_is_argmax_with_ties():
  from rsi_jax.sampler.sampling import first_argmax
  x = np.random.default_rng(0).integers(0, 5, (64, 1000)).astype(np.float32)  # many ties at the maximum
  x[3] = -np.inf
  x[4, 999] = 10.0
  got = np.asarray(first_argmax(jnp.asarray(x), jnp.max(jnp.asarray(x), axis=-1)))
  np.testing.assert_array_equal(got, np.argmax(x, axis=-1))


def reference_keep(row, top_k, top_p):
  """The kept set written out with a sort, in float64: the k best (ties at the k-th kept), then the
  smallest descending prefix of them whose mass reaches top_p, and every token tied with its last one.
  Returns the kept set and how close the cut's mass came to top_p (rounding decides a cut that close)."""
  z = np.asarray(row, np.float64)
  desc = np.sort(z)[::-1]
  k = len(z) if top_k == 0 else min(top_k, len(z))
  keep = (z >= desc[k - 1]) & (z > -np.inf)
  if top_p >= 1:
    return keep, np.inf
  p = np.where(keep, np.exp(z - z.max()), 0.0)
  p /= p.sum()
  order = np.argsort(-z, kind="stable")
  before, margin = 0.0, np.inf
  for i in order:
    if not keep[i]:
      continue
    margin = min(margin, abs(before - top_p))
    if before >= top_p:
      return keep & (z >= z[last]), margin
    last, before = i, before + p[i]
  return keep & (z >= z[last]), margin


def test_truncation_mask_equals_the_sorted_reference():
  """Random rows with ties (rounded logits, -0.0 beside 0.0), -inf entries and every mix of top-k and top-p,
  against a float64 sort; a cut whose mass lies within rounding of top_p is skipped."""
  from rsi_jax.sampler.sampling import truncation_mask
  rng = np.random.default_rng(7)
  mask = jax.jit(truncation_mask)
  checked = 0
  for trial in range(40):
    x = (rng.normal(size=(8, 48)) * 2).astype(np.float32)
    if trial % 2:
      x = np.round(x)
      x[:, ::5] = -0.0
    if trial % 5 == 0:
      x[:, ::7] = -np.inf
    top_k = rng.integers(0, 52, 8).astype(np.int32)
    top_p = rng.choice([1.0, 0.2, 0.5, 0.8, 0.95, 0.999], 8).astype(np.float32)
    got = np.asarray(mask(jnp.asarray(x), jnp.asarray(top_k), jnp.asarray(top_p)))
    for i in range(8):
      want, margin = reference_keep(x[i], int(top_k[i]), float(top_p[i]))
      if margin < 1e-5:
        continue
      np.testing.assert_array_equal(got[i], want, err_msg=f"row {x[i]} top_k {top_k[i]} top_p {top_p[i]}")
      checked += 1
  assert checked > 300


def test_truncation_over_a_real_vocabulary_does_not_sort_it():
  """A sort of the whole vocabulary per decode step cost 20-30x the bisection on CPU: the sampling program
  has none, and its kept set over 151,936 logits is the sorted reference's."""
  from rsi_jax.sampler.sampling import truncation_mask
  v = 151_936
  x = (np.random.default_rng(3).normal(size=(2, v)) * 3 / 0.6).astype(np.float32)
  top_k, top_p = np.array([0, 50], np.int32), np.array([0.95, 0.9], np.float32)
  got = np.asarray(jax.jit(truncation_mask)(jnp.asarray(x), jnp.asarray(top_k), jnp.asarray(top_p)))
  for i in range(2):
    want, margin = reference_keep(x[i], int(top_k[i]), float(top_p[i]))
    assert margin > 1e-6
    np.testing.assert_array_equal(got[i], want)
  n = 4
  hlo = jax.jit(sample_tokens).lower(
      jnp.zeros((n, v)), jax.random.split(jax.random.key(0), n), jnp.full((n,), 0.6), jnp.zeros((n,), jnp.int32),
      jnp.full((n,), 0.95)).as_text()
  assert "stablehlo.sort" not in hlo
