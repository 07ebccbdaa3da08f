"""TB-GAE over episodes split into linked segments (rows joined by ``next_row``), the pipeline's call.

Batches are random rows in a random order: episodes cut into segments at random points (inside turns too,
segments without generated tokens included), rows that pack whole terminated episodes before an episode's
first segment or after its terminated last one, observation tokens inside turns, true terminations and
cuts, padding rows, and garbage (NaN values and rewards, random turn ids and dones) wherever gen_mask = 0.
References: a slow loop over each joined episode written from Eq. 8–10, and the former multi-pass linking
(a TB-GAE pass per link, each handing every row its continuation's carry, Eq. 12).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsi_jax.config import CONFIG_DIR, ConfigError, load_config
from rsi_jax.pipeline.rpr import chain_links, linked_tb_gae, to_device_batch
from rsi_jax.rl.advantages import TBGAECarry, tb_gae
from rsi_jax.rl.batch import TrajectoryBatch
from rsi_jax.rl.linked_gae import DONE, NEW_TURN, NODE, chained_tb_gae, clock_flags, gae_impl

ROWS, T = 10, 40
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOL = dict(rtol=2e-5, atol=2e-4)  # float32 kernels vs a float64 reference
CLOSE = dict(rtol=1e-5, atol=1e-5)  # two float32 kernels, same sums in a different order

CHAINED = {impl: jax.jit(chained_tb_gae, static_argnames="impl") for impl in ("scan", "associative")}
clock = st.one_of(st.sampled_from([0.0, 0.5, 0.9, 1.0]), st.floats(0.0, 1.0))


# ------------------------------------------------------------------------------------------- batches


def _episode(rng, terminated):
  """[prompt] ([gen]+ with observations inside or after)+ as ("o",) / ("g", turn) tokens; done on the last
  generated token if terminated."""
  toks = [("o",)] * int(rng.integers(0, 3))
  turn = int(rng.integers(0, 3))
  for _ in range(int(rng.integers(1, 4))):
    gen = [("g", turn)] * int(rng.integers(1, 5))
    if rng.random() < 0.3:  # an observation inside the turn: the clock stays (1, 1) across it
      at = int(rng.integers(1, len(gen) + 1))
      gen = gen[:at] + [("o",)] * int(rng.integers(1, 3)) + gen[at:]
    toks += gen + [("o",)] * int(rng.integers(0, 4))
    turn += int(rng.integers(1, 3))
  if terminated:
    i = max(i for i, x in enumerate(toks) if x[0] == "g")
    toks[i] = ("g", toks[i][1], "done")
  return toks


def linked_batch(seed, n_rows=ROWS, n_tok=T):
  """A TrajectoryBatch of linked rows (random order) and its chains: row lists in episode order."""
  rng = np.random.default_rng(seed)
  rows, chains = [], []  # rows: token lists; chains: lists of row indices
  while len(rows) < n_rows:
    terminated = rng.random() < 0.6
    toks = _episode(rng, terminated)
    k = int(rng.integers(1, min(4, n_rows - len(rows)) + 1))
    cuts = np.sort(rng.integers(0, len(toks) + 1, size=k - 1))
    segs = [toks[lo:hi] for lo, hi in zip([0, *cuts], [*cuts, len(toks)])]
    segs = [s if i == 0 else [("o",)] * int(rng.integers(0, 3)) + s for i, s in enumerate(segs)]  # summary
    if rng.random() < 0.4 and len(segs[0]) < n_tok // 2:  # whole terminated episodes before the first segment
      segs[0] = _episode(rng, True) + segs[0]
    if terminated and rng.random() < 0.4 and len(segs[-1]) < n_tok // 2:  # ... and after a terminated end
      segs[-1] = segs[-1] + _episode(rng, True)
    if any(len(s) > n_tok for s in segs):
      continue
    chains.append(list(range(len(rows), len(rows) + len(segs))))
    rows += segs
  order = rng.permutation(n_rows)  # row r goes to position order[r]
  shape = (n_rows, n_tok)
  values = np.where(rng.random(shape) < 0.2, np.nan, rng.normal(size=shape)).astype(np.float32)
  rewards = np.where(rng.random(shape) < 0.2, np.nan, rng.normal(size=shape)).astype(np.float32)
  turn_ids = rng.integers(-5, 20, size=shape).astype(np.int32)
  dones = (rng.random(shape) < 0.3).astype(np.float32)
  gen = np.zeros(shape, np.float32)
  sparse = rng.random() < 0.5
  for r, toks in enumerate(rows):
    b = order[r]
    for j, x in enumerate(toks):
      if x[0] == "g":
        gen[b, j], turn_ids[b, j], dones[b, j] = 1.0, x[1], float(len(x) == 3)
        values[b, j] = rng.normal()
        rewards[b, j] = rng.normal() if (not sparse or rng.random() < 0.2) else 0.0
  next_row = np.full(n_rows, -1, np.int32)
  for c in chains:
    for r, s in zip(c[:-1], c[1:]):
      next_row[order[r]] = order[s]
  chains = [[int(order[r]) for r in c] for c in chains]
  z = np.zeros(shape, np.int32)
  batch = TrajectoryBatch(z, z, z, gen, turn_ids, rewards, dones, z.astype(np.float32), z, np.ones(n_rows),
                          next_row)
  return batch, values, chains


# ---------------------------------------------------------------------------------------- references


def ref_joined(batch, values, chains, gamma, lam):
  """Eq. 8–10 over each joined episode, float64: the chain's nodes in order, Γ/Λ per edge (Eq. 8), δ and w
  (Eq. 9), A_j = Σ_k W_{j,k} δ_k with W_{j,k} = Π_{i=j}^{k−1} w_i (Eq. 10)."""
  adv = np.zeros(values.shape)
  for chain in chains:
    nodes = [(b, j) for b in chain for j in range(values.shape[1]) if batch.gen_mask[b, j] > 0]
    n = len(nodes)
    delta, w = np.zeros(n), np.zeros(n)
    for i, (b, j) in enumerate(nodes):
      v, r = float(values[b, j]), float(batch.rewards[b, j])
      if batch.dones[b, j] > 0 or i == n - 1:  # no successor: its value and trace are 0
        delta[i], w[i] = r - v, 0.0
        continue
      b2, j2 = nodes[i + 1]
      same = batch.turn_ids[b2, j2] == batch.turn_ids[b, j]
      big_g, big_l = (1.0, 1.0) if same else (gamma, lam)  # Eq. 8
      delta[i] = r + big_g * float(values[b2, j2]) - v  # Eq. 9
      w[i] = big_g * big_l
    for i, (b, j) in enumerate(nodes):
      total, weight = 0.0, 1.0
      for k in range(i, n):
        total += weight * delta[k]  # Eq. 10
        weight *= w[k]
      adv[b, j] = total
  gen = batch.gen_mask > 0
  return adv, np.where(gen, adv + np.where(gen, values, 0.0), 0.0)


def multi_pass(values, batch, gamma, lam, links):
  """The former linking: a TB-GAE pass, then ``links`` more, each handing every row the carry of its
  continuation's first generated token (a continuation without one passes its own carry through)."""
  return _multi_pass(values, batch.rewards, batch.turn_ids, batch.gen_mask, batch.dones, batch.next_row, gamma,
                     lam, links)


@functools.partial(jax.jit, static_argnums=8)
def _multi_pass(values, rewards, turn_ids, gen, dones, nxt, gamma, lam, links):
  args = (values, rewards, turn_ids, gen, dones)
  res = tb_gae(*args, gamma, lam)
  has_next = nxt >= 0
  nxt_c = jnp.where(has_next, nxt, 0)
  next_gen = gen[nxt_c].sum(-1) > 0
  first = jnp.argmax(gen > 0, axis=1)
  take = lambda a: a[nxt_c, first[nxt_c]]
  inherit = has_next & ~next_gen
  carry = None
  for _ in range(links):
    own = TBGAECarry(value=take(values).astype(jnp.float32), advantage=take(res.advantages),
                     turn_id=take(turn_ids).astype(jnp.int32), present=has_next & next_gen)
    if carry is not None:
      own = jax.tree.map(lambda o, c: jnp.where(inherit, c[nxt_c], o), own, carry)
    carry = own
    res = tb_gae(*args, gamma, lam, carry=carry)
  return res


def run(impl, batch, values, gamma, lam, links=None):
  flags = clock_flags(batch.gen_mask, batch.turn_ids, batch.dones, batch.next_row)
  return CHAINED[impl](values, batch.rewards, flags, batch.next_row, gamma, lam, links, impl=impl)


# ------------------------------------------------------------------------------------------------ tests


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), gamma=clock, lam=clock)
def test_chained_equals_joined_episode_reference_and_multi_pass(seed, gamma, lam):
  batch, values, chains = linked_batch(seed)
  want_adv, want_ret = ref_joined(batch, values, chains, gamma, lam)
  old = multi_pass(values, batch, gamma, lam, chain_links(batch))
  got = {impl: run(impl, batch, values, gamma, lam) for impl in CHAINED}
  for impl, res in got.items():
    assert res.advantages.dtype == res.returns.dtype == jnp.float32
    np.testing.assert_allclose(res.advantages, want_adv, **TOL, err_msg=impl)
    np.testing.assert_allclose(res.returns, want_ret, **TOL, err_msg=impl)
    np.testing.assert_allclose(res.advantages, old.advantages, **CLOSE, err_msg=impl)
    np.testing.assert_allclose(res.returns, old.returns, **CLOSE, err_msg=impl)
  np.testing.assert_allclose(got["scan"].advantages, got["associative"].advantages, **CLOSE)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), gamma=clock, lam=clock, links=st.integers(0, 3))
def test_link_limit_equals_that_many_carry_passes(seed, gamma, lam, links):
  # links = k: each row sees k following segments (segments without generated tokens count), like k passes
  batch, values, _ = linked_batch(seed)
  old = multi_pass(values, batch, gamma, lam, links)
  for impl in CHAINED:
    res = run(impl, batch, values, gamma, lam, links)
    np.testing.assert_allclose(res.advantages, old.advantages, **CLOSE, err_msg=impl)
    np.testing.assert_allclose(res.returns, old.returns, **CLOSE, err_msg=impl)


@pytest.mark.parametrize("impl", sorted(CHAINED))
def test_long_chain_in_one_pass(impl):
  # one episode over all rows (the longest chain a batch can hold), rows reversed: the pointer doubling's
  # every level is used; against one unsplit row
  rng = np.random.default_rng(5)
  n, t = 9, 12
  gen = (rng.random((n, t)) < 0.6).astype(np.float32)
  gen[3] = 0  # a segment without generated tokens in the middle
  turns = np.cumsum(rng.random((n, t)) < 0.3, axis=1).astype(np.int32) + 10 * np.arange(n)[::-1, None]
  turns[5] = turns[4] = 77  # a turn that continues across the link from segment 3 (row 5) to 4 (row 4)
  values = rng.normal(size=(n, t)).astype(np.float32)
  rewards = (rng.normal(size=(n, t)) * gen).astype(np.float32)
  dones = np.zeros((n, t), np.float32)
  order = np.arange(n)[::-1]  # segment s of the episode sits in row order[s]
  next_row = np.full(n, -1, np.int32)
  next_row[order[:-1]] = order[1:]
  row = lambda x: x[order].reshape(1, -1)
  one = tb_gae(row(values), row(rewards), row(turns), row(gen), row(dones), 0.9, 0.8)
  flags = clock_flags(gen, turns, dones, next_row)
  res = CHAINED[impl](values, rewards, flags, next_row, 0.9, 0.8, impl=impl)
  np.testing.assert_allclose(row(np.asarray(res.advantages)), one.advantages, **CLOSE)


def test_one_compile_for_any_chain_depth():
  """The pipeline's call compiles once per batch shape: chain structures (1 to 5 segments an episode) only
  change arrays."""
  traces = []

  def call(values, batch):
    traces.append(1)
    return linked_tb_gae(values, batch, 0.9, 0.8)

  fn = jax.jit(call)
  depths = set()
  for seed in range(12):
    batch, values, chains = linked_batch(seed)
    depths.add(chain_links(batch))
    want, _ = ref_joined(batch, values, chains, 0.9, 0.8)
    np.testing.assert_allclose(fn(values, to_device_batch(batch)).advantages, want, **TOL)
  rng = np.random.default_rng(0)  # and one episode through five rows
  batch, values, _ = linked_batch(0)
  batch = batch._replace(next_row=np.array([1, 2, 3, 4, -1, -1, -1, -1, -1, -1], np.int32))
  depths.add(chain_links(batch))
  fn(values + rng.normal(size=values.shape).astype(np.float32), to_device_batch(batch))
  assert len(depths) >= 3 and len(traces) == 1


def test_clock_flags_across_links_and_empty_segments():
  # episode: row 2 -> row 0 (no generated token) -> row 1; row 3 is a lone cut episode
  gen = np.array([[0, 0, 0, 0], [0, 1, 1, 0], [1, 1, 0, 1], [0, 1, 0, 1]], np.float32)
  turns = np.array([[9, 9, 9, 9], [7, 3, 4, 7], [2, 2, 5, 3], [1, 1, 6, 1]], np.int32)
  dones = np.array([[1, 1, 1, 1], [0, 0, 1, 1], [1, 0, 1, 0], [0, 0, 1, 0]], np.float32)
  flags = clock_flags(gen, turns, dones, np.array([1, -1, 0, -1]))
  want = np.array([[0, 0, 0, 0],
                   [0, NODE, NODE | DONE | NEW_TURN, 0],  # 3 follows row 2's last node (turn 3): same turn
                   [NODE | DONE, NODE, 0, NODE | NEW_TURN],  # dones and turn ids off the nodes are not read
                   [0, NODE, 0, NODE]])  # turn 1 then turn 1 across an observation
  np.testing.assert_array_equal(flags, want)
  z = np.zeros((2, 3))
  assert not clock_flags(z, z, z, np.array([1, -1])).any()  # no generated token at all


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_clock_flags_equal_a_walk_over_each_episode(seed):
  batch, _, chains = linked_batch(seed)
  want = np.zeros(batch.gen_mask.shape, np.uint8)
  for chain in chains:
    before = None  # the turn id of the previous node of the episode
    for b in chain:
      for j in np.flatnonzero(batch.gen_mask[b] > 0):
        t = batch.turn_ids[b, j]
        want[b, j] = NODE | (DONE if batch.dones[b, j] > 0 else 0) | (NEW_TURN if before not in (None, t) else 0)
        before = t
  np.testing.assert_array_equal(clock_flags(batch.gen_mask, batch.turn_ids, batch.dones, batch.next_row), want)


@pytest.mark.parametrize("next_row,msg", [
    ([1, 2, 0], r"next_row: rows \[0, 1, 2\] form a cycle"),
    ([2, 2, -1], r"next_row: row 2 continues two rows \(0 and 1\)"),
    ([3, -1, -1], r"next_row: row 0 continues into row 3, outside the batch's 3 rows"),
])
def test_malformed_links_are_refused(next_row, msg):
  z = np.zeros((3, 4), np.float32)
  with pytest.raises(ValueError, match=msg):
    clock_flags(z, z, z, np.array(next_row))
  with pytest.raises(ValueError, match=msg):
    chain_links(TrajectoryBatch(*([z] * 10), np.array(next_row)))


def test_gae_impl_setting():
  assert load_config(CONFIG_DIR / "base.yml").rl.gae_impl == "auto"
  with pytest.raises(ConfigError, match="rl.gae_impl: must be 'scan', 'associative' or 'auto', got 'fast'"):
    load_config(CONFIG_DIR / "base.yml", ["rl.gae_impl=fast"])
  assert gae_impl("auto") == ("scan" if jax.default_backend() == "cpu" else "associative")
  assert gae_impl("associative") == "associative"
  with pytest.raises(ValueError, match="gae_impl must be one of scan, associative, auto, got 'fast'"):
    gae_impl("fast")
