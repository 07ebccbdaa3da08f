"""Batch assembly from episode records, and linked TB-GAE across summarization segments."""

import jax.numpy as jnp
import numpy as np
import pytest

from rsi_jax.pipeline.rpr import chain_links, linked_tb_gae, to_device_batch
from rsi_jax.rl.advantages import tb_gae
from rsi_jax.rl.batch import Sample, assemble_batch


def _sample(gen, turns, episode=0, seed=0):
  rng = np.random.default_rng(seed)
  gen = np.asarray(gen, bool)
  return Sample(ids=rng.integers(0, 1000, len(gen)), gen_mask=gen,
                logprobs=np.where(gen, -rng.random(len(gen)), 0).astype(np.float32),
                turn_ids=np.asarray(turns), episode=episode)


def test_reward_and_done_on_last_generated_token_of_last_segment():
  seg1 = _sample([0, 0, 1, 1, 0, 1, 0], [-1, -1, 0, 0, 0, 1, 1])
  seg2 = _sample([0, 1, 1, 0], [1, 2, 2, 2])
  other = _sample([0, 1, 1, 1, 0, 0], [-1, 0, 0, 0, 0, 0])
  b = assemble_batch([[seg1, seg2], [other]], rewards=[0.7, 1.5], pad_multiple=8, pad_id=5, num_rows=4)
  assert b.tokens.shape == (4, 8)
  np.testing.assert_array_equal(b.next_row, [1, -1, -1, -1])
  # episode 0: nothing on its first segment, the reward on seg2's last generated token (index 2)
  assert b.rewards[0].sum() == 0 and b.dones[0].sum() == 0
  assert b.rewards[1, 2] == pytest.approx(0.7) and b.dones[1, 2] == 1 and b.rewards[1].sum() == pytest.approx(0.7)
  # episode 1: its last generated token is index 3 (trailing observation tokens are not generated)
  assert b.rewards[2, 3] == pytest.approx(1.5) and b.dones[2].sum() == 1
  # rewards only on generated tokens, padding is segment 0 / pad id, positions count real tokens
  assert (b.rewards * (1 - b.gen_mask)).sum() == 0
  assert (b.segment_ids[0] == [1] * 7 + [0]).all() and b.tokens[0, 7] == 5
  np.testing.assert_array_equal(b.positions[2], [0, 1, 2, 3, 4, 5, 0, 0])
  np.testing.assert_array_equal(b.row_mask, [1, 1, 1, 0])
  np.testing.assert_allclose(b.sampler_logprobs[0, :7], seg1.logprobs)
  assert chain_links(b) == 1


def test_infrastructure_failures_are_masked_not_scored():
  ok = _sample([0, 1, 1], [-1, 0, 0])
  crashed = _sample([0, 1, 1, 1], [-1, 0, 0, 0])
  b = assemble_batch([[ok], [crashed]], rewards=[1.0, 0.0], train_mask=[True, False])
  assert b.row_mask.tolist() == [1, 0]
  assert b.gen_mask[1].sum() == 0 and b.rewards[1].sum() == 0 and b.dones[1].sum() == 0
  assert b.segment_ids[1, :4].tolist() == [1, 1, 1, 1]  # tokens kept (for logging), not trained


def test_assembly_errors():
  s = _sample([0, 1], [-1, 0])
  with pytest.raises(ValueError, match="1 episodes but 2 rewards"):
    assemble_batch([[s]], [1.0, 2.0])
  with pytest.raises(ValueError, match="num_rows=0 is smaller"):
    assemble_batch([[s]], [1.0], num_rows=0)
  with pytest.raises(ValueError, match="not finite"):
    assemble_batch([[s]], [float("nan")])
  bad = Sample(np.zeros(3, int), np.zeros(2, bool), np.zeros(3, np.float32), np.zeros(3, int))
  with pytest.raises(ValueError, match="differ in length"):
    assemble_batch([[bad]], [0.0])


@pytest.mark.parametrize("gamma_turn,lambda_turn", [(1.0, 1.0), (0.9, 0.8)])
def test_linked_segments_equal_one_unsplit_row(gamma_turn, lambda_turn):
  """A rollout split by summarization into segments trains as if it were one row (observations and the
  summary prompt are non-generated tokens, which TB-GAE skips): the carry links the segments exactly."""
  seg1 = _sample([0, 1, 1, 0, 0, 1, 1, 0], [-1, 0, 0, 0, 0, 1, 1, 1], seed=1)
  seg2 = _sample([0, 0, 1, 1, 0, 1], [1, 1, 2, 2, 2, 3], seed=2)
  linked = assemble_batch([[seg1, seg2]], rewards=[1.3])
  whole = Sample(np.concatenate([seg1.ids, seg2.ids]), np.concatenate([seg1.gen_mask, seg2.gen_mask]),
                 np.concatenate([seg1.logprobs, seg2.logprobs]), np.concatenate([seg1.turn_ids, seg2.turn_ids]))
  one = assemble_batch([[whole]], rewards=[1.3])
  rng = np.random.default_rng(0)
  v_one = rng.normal(size=one.tokens.shape).astype(np.float32)
  v_linked = np.zeros(linked.tokens.shape, np.float32)
  v_linked[0, :8], v_linked[1, :6] = v_one[0, :8], v_one[0, 8:]
  r_link = linked_tb_gae(jnp.asarray(v_linked), to_device_batch(linked), gamma_turn, lambda_turn,
                         chain_links(linked))
  d = to_device_batch(one)
  r_one = tb_gae(jnp.asarray(v_one), d["rewards"], d["turn_ids"], d["gen_mask"], d["dones"], gamma_turn,
                 lambda_turn)
  got = np.concatenate([np.asarray(r_link.advantages)[0, :8], np.asarray(r_link.advantages)[1, :6]])
  np.testing.assert_allclose(got, np.asarray(r_one.advantages)[0, :14], rtol=1e-6, atol=1e-6)
  # without the link the first segment would be cut (its last advantage differs)
  r_cut = linked_tb_gae(jnp.asarray(v_linked), to_device_batch(linked), gamma_turn, lambda_turn, 0)
  assert not np.allclose(np.asarray(r_cut.advantages)[0, :8], got[:8])


@pytest.mark.parametrize("empty_last", [True, False])
def test_segment_without_generated_tokens_keeps_reward_and_link(empty_last):
  """A segment whose first call was rejected (no generated token) sits last or between two segments: the
  reward and done land on the rollout's last generated token, and linked TB-GAE carries through the empty
  segment, so the rollout trains exactly as one unsplit row."""
  seg1 = _sample([0, 1, 1, 0, 1, 0], [-1, 0, 0, 0, 1, 1], seed=3)
  empty = _sample([0, 0, 0, 0], [1, 1, 1, 1], seed=4)
  seg3 = _sample([0, 1, 1, 0, 1], [1, 2, 2, 2, 3], seed=5)
  segs = [seg1, seg3, empty] if empty_last else [seg1, empty, seg3]
  b = assemble_batch([segs], rewards=[0.9])
  term_row = 1 if empty_last else 2
  j = int(np.flatnonzero(b.gen_mask[term_row])[-1])
  assert b.rewards[term_row, j] == pytest.approx(0.9) and b.dones[term_row, j] == 1
  assert b.dones.sum() == 1 and b.rewards.sum() == pytest.approx(0.9)
  # against one unsplit row holding only the segments with generated tokens
  real = [seg1, seg3]
  whole = Sample(*(np.concatenate([getattr(s, f) for s in real]) for f in ("ids", "gen_mask", "logprobs",
                                                                            "turn_ids")))
  one = assemble_batch([[whole]], rewards=[0.9])
  rng = np.random.default_rng(1)
  v_one = rng.normal(size=one.tokens.shape).astype(np.float32)
  v = np.zeros(b.tokens.shape, np.float32)
  rows = {id(s): r for r, s in enumerate(segs)}
  v[rows[id(seg1)], :6], v[rows[id(seg3)], :5] = v_one[0, :6], v_one[0, 6:11]
  v[rows[id(empty)], :4] = rng.normal(size=4)  # never read: no generated token there
  res = linked_tb_gae(jnp.asarray(v), to_device_batch(b), 0.9, 0.8, chain_links(b))
  d = to_device_batch(one)
  ref = tb_gae(jnp.asarray(v_one), d["rewards"], d["turn_ids"], d["gen_mask"], d["dones"], 0.9, 0.8)
  adv = np.asarray(res.advantages)
  got = np.concatenate([adv[rows[id(seg1)], :6], adv[rows[id(seg3)], :5]])
  np.testing.assert_allclose(got, np.asarray(ref.advantages)[0, :11], rtol=1e-6, atol=1e-6)


def test_weight_versions_are_kept_per_token():
  s = _sample([0, 1, 1, 0, 1], [-1, 0, 0, 0, 1])
  s = Sample(s.ids, s.gen_mask, s.logprobs, s.turn_ids, 0, np.array([-1, 4, 4, -1, 5], np.int32))
  b = assemble_batch([[s], [_sample([0, 1], [-1, 0])]], rewards=[1.0, 0.0], pad_multiple=8)
  assert b.weight_versions[0].tolist() == [-1, 4, 4, -1, 5, -1, -1, -1]
  assert (b.weight_versions[1] == -1).all()  # no versions recorded
