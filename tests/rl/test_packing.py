"""Learner passes (rsi_jax/rl/packing.py): token-budget packing, dynamic balancing, micro-batches, and the
losses / gradients of packed, accumulated passes against the unpacked single batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rsi_jax.rl.losses import ppo_policy_loss, sft_loss, value_loss
from rsi_jax.rl.metrics import combine_pass_metrics, masked_token_mean
from rsi_jax.rl.packing import pass_index, plan_passes, take


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget,micro,balance", [(0, 0, False), (0, 2, False), (32, 0, False), (32, 0, True),
                                                  (32, 2, True), (20, 1, False)])
def test_plan_places_every_sample_once_within_budget(seed, budget, micro, balance):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(0, 30, size=int(rng.integers(1, 14)))
  lengths[rng.integers(len(lengths))] = 45  # longer than every budget: a row of its own
  shards = int(rng.integers(1, 4))
  plan = plan_passes(lengths, shards=shards, token_budget=budget, micro_batch=micro, pad_multiple=8,
                     balance=balance)
  placed = plan.samples
  assert sorted(placed) == [i for i in range(len(lengths)) if lengths[i] > 0]  # each sample once
  assert plan.length % 8 == 0
  for rows in plan.rows:
    assert len(rows) == plan.rows_per_pass == shards * plan.rows_per_shard
    for row in rows:
      fill = sum(lengths[s] for s in row)
      assert fill <= plan.length
      if budget:
        assert fill <= budget or len(row) == 1
      if budget and micro:
        assert len(row) <= micro
    if not budget and micro:
      assert plan.rows_per_shard == micro
  if budget:
    assert plan.rows_per_shard == 1
  # the index arrays move every real token to the packed layout and back
  ts = int(lengths.max())
  idx = pass_index(plan, ts)
  x = rng.normal(size=(len(lengths), ts)).astype(np.float32)
  real = np.arange(ts)[None] < lengths[:, None]
  back = take(take(x, idx.gather), idx.scatter)
  np.testing.assert_array_equal(back, np.where(real, x, 0))
  # segment ids count the samples along each row; positions restart at 0 in each
  for p, rows in enumerate(plan.rows):
    for r, row in enumerate(rows):
      seg = idx.segment_ids[p, r]
      assert list(np.unique(seg[seg > 0])) == list(range(1, len(row) + 1))
      for k, s in enumerate(row, start=1):
        np.testing.assert_array_equal(idx.positions[p, r][seg == k], np.arange(lengths[s]))


def test_dynamic_balancing_evens_the_shards():
  """Two long and two short samples on 2 shards: contiguous blocks give one shard both long ones (16 vs 2
  tokens: 1.78x the mean); balancing gives 9 and 9."""
  lengths = [8, 8, 1, 1]
  plain = plan_passes(lengths, shards=2, token_budget=16, pad_multiple=1)
  bal = plan_passes(lengths, shards=2, token_budget=16, pad_multiple=1, balance=True)
  assert plain.shard_tokens().sum(0).tolist() == [16, 2]
  assert plain.stats()["packing/shard_imbalance"] == pytest.approx(16 / 9)
  assert bal.shard_tokens().sum(0).tolist() == [9, 9] and bal.stats()["packing/shard_imbalance"] == 1.0
  # first-fit decreasing packs 9 tokens per row: one pass, not two
  assert bal.passes == 1 and plain.passes == 1
  assert plan_passes([5, 5, 5, 5], shards=1, token_budget=10, pad_multiple=1).passes == 2


def _random_layout(seed, n=7, ts=12):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, ts + 1, size=n)
  real = np.arange(ts)[None] < lengths[:, None]
  gen = real & (rng.random((n, ts)) < 0.6)
  gen[:, 0] = False
  gen[2] = False  # a sample without trainable tokens: excluded from E_j, not counted as zero
  arrays = {k: np.where(real, rng.normal(size=(n, ts)), 0).astype(np.float32)
            for k in ("logp", "old_logp", "adv", "values", "old_values", "returns")}
  return lengths, gen.astype(np.float32), arrays


@pytest.mark.parametrize("budget,micro,shards,balance", [(16, 0, 1, False), (16, 0, 2, True), (24, 2, 2, False),
                                                         (0, 2, 1, False)])
def test_packed_accumulated_losses_and_grads_equal_the_unpacked_batch(budget, micro, shards, balance):
  """PPO, value and SFT losses over packed passes (segment ids, the whole batch's sample count as the E_j
  denominator), summed over the passes, equal the one-sample-per-row batch: values and gradients. The
  sample-level mean is kept (it differs from the token-level mean here, so a token-level slip would fail)."""
  lengths, gen, a = _random_layout(0)
  n, ts = gen.shape
  trainable = [i for i in range(n) if gen[i].sum() > 0]
  plan = plan_passes(lengths, samples=trainable, shards=shards, token_budget=budget, micro_batch=micro,
                     pad_multiple=4, balance=balance)
  assert plan.passes > 1  # accumulation is exercised
  idx = pass_index(plan, ts)
  n_samples = np.float32(len(trainable))

  def unpacked(logp, values):
    lp, _ = ppo_policy_loss(logp, a["old_logp"], a["adv"], gen, clip_low=0.2, clip_high=0.3)
    lv, _ = value_loss(values, a["old_values"], a["returns"], gen, clip=0.5)
    ls, _ = sft_loss(logp, gen, normalize="per_sample")
    lm, _ = sft_loss(logp, gen, normalize="sample_mean")
    return jnp.stack([lp, lv, ls, lm])

  def packed(logp, values):
    total, auxes = 0.0, []
    for p in range(plan.passes):
      g, seg = idx.gather[p], idx.segment_ids[p]
      pk = lambda x: take(x, jnp.asarray(g))
      m = take(gen, g)
      lp, aux = ppo_policy_loss(pk(logp), pk(a["old_logp"]), pk(a["adv"]), m, clip_low=0.2, clip_high=0.3,
                                segment_ids=seg, num_samples=n_samples)
      lv, _ = value_loss(pk(values), pk(a["old_values"]), pk(a["returns"]), m, clip=0.5, segment_ids=seg,
                         num_samples=n_samples)
      ls, _ = sft_loss(pk(logp), m, normalize="per_sample", segment_ids=seg, num_samples=n_samples)
      lm, _ = sft_loss(pk(logp), m, normalize="sample_mean", segment_ids=seg, num_samples=n_samples)
      total = total + jnp.stack([lp, lv, ls, lm])
      auxes.append(aux)
    return total, auxes

  logp, values = jnp.asarray(a["logp"]), jnp.asarray(a["values"])
  want = unpacked(logp, values)
  got, auxes = packed(logp, values)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
  token_mean = float(masked_token_mean(-np.asarray(a["adv"]), gen))
  assert abs(float(want[0]) - token_mean) > 1e-2  # E_j is sample-level, not token-level, in this batch
  for k in range(4):
    gw = jax.grad(lambda lp, v: unpacked(lp, v)[k], argnums=(0, 1))(logp, values)
    gg = jax.grad(lambda lp, v: packed(lp, v)[0][k], argnums=(0, 1))(logp, values)
    for x, y in zip(gg, gw):
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
  # the passes' monitoring metrics combine to the whole batch's
  _, whole = ppo_policy_loss(logp, a["old_logp"], a["adv"], gen, clip_low=0.2, clip_high=0.3)
  comb = combine_pass_metrics(auxes)
  for key in ("clip_frac", "clip_frac_high", "ratio_mean", "approx_kl", "advantage_mean", "num_tokens",
              "num_samples", "ratio_min", "ratio_max", "policy_loss"):
    assert comb[key] == pytest.approx(float(whole[key]), rel=1e-5, abs=1e-6), key
