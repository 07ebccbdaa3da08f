"""GAE / TB-GAE against a slow loop written from Eq. 8–9, the paper's identities (Eq. 10–13), rlax, chunking.

Batches are hypothesis-built padded rows that pack several episodes with prompts, observations, several turns,
terminations and truncations (including a cut at the row end). Shapes are fixed per test, and every jitted
function is module-level, so each compiles once per shape.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsi_jax.rl import (TBGAECarry, gae, gae_associative, tb_gae, tb_gae_associative)

B, T = 4, 48
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TB = jax.jit(tb_gae)
TB_ASSOC = jax.jit(tb_gae_associative)
GAE = jax.jit(gae)
GAE_ASSOC = jax.jit(gae_associative)
TB_IMPLS = {"scan": TB, "associative": TB_ASSOC}
GAE_IMPLS = {"scan": GAE, "associative": GAE_ASSOC}

TOL = dict(rtol=2e-5, atol=2e-4)  # float32 kernels vs float64 references, sums of up to ~50 terms
EXACT = dict(rtol=1e-6, atol=1e-6)  # the same float32 operations in the same order


# ------------------------------------------------------------------------------------------ references


def ref_tb_gae(values, rewards, turn_ids, mask, dones, gamma, lam, carry=None):
  """Eq. 8–9 as a plain loop over each row's retained (mask = 1) positions, float64."""
  n_rows, n_tok = values.shape
  adv = np.zeros((n_rows, n_tok))
  ret = np.zeros((n_rows, n_tok))
  out = []
  for b in range(n_rows):
    if carry is not None and bool(carry.present[b]):
      succ = (float(carry.value[b]), float(carry.advantage[b]), int(carry.turn_id[b]))
    else:
      succ = None
    for j in reversed(range(n_tok)):
      if not mask[b, j]:
        continue
      v, r, t = float(values[b, j]), float(rewards[b, j]), int(turn_ids[b, j])
      if dones[b, j] or succ is None:  # zero successor value and trace
        a = r - v
      else:
        v_next, a_next, t_next = succ
        big_g, big_l = (1.0, 1.0) if t_next == t else (gamma, lam)  # Eq. 8
        a = (r + big_g * v_next - v) + big_g * big_l * a_next  # Eq. 9
      adv[b, j], ret[b, j] = a, a + v
      succ = (v, a, t)
    out.append(succ)
  return adv, ret, out


def ref_gae(values, rewards, dones, mask, gamma, lam, bootstrap=None):
  """Token-clock GAE over masked positions, a separate plain loop."""
  adv = np.zeros(values.shape)
  for b in range(values.shape[0]):
    v_next = 0.0 if bootstrap is None else float(bootstrap[b])
    a_next = 0.0
    for j in reversed(range(values.shape[1])):
      if not mask[b, j]:
        continue
      nd = 0.0 if dones[b, j] else 1.0
      delta = rewards[b, j] + gamma * nd * v_next - values[b, j]
      a = delta + gamma * lam * nd * a_next
      adv[b, j] = a
      v_next, a_next = values[b, j], a
  return adv, np.where(mask, adv + values, 0.0)


class Chain(NamedTuple):
  """One row's retained chain with Eq. 8–9's per-node terms (no carry: the row end is an episode end)."""
  nodes: np.ndarray  # token positions of the retained nodes
  big_g: np.ndarray  # Γ_j
  big_l: np.ndarray  # Λ_j
  live: np.ndarray  # 1 − d_j, and 0 at the last node (no successor)
  w: np.ndarray  # Γ Λ (1 − d)
  delta: np.ndarray  # δ_j


def chain(batch, b, gamma, lam, values=None):
  values = batch.values if values is None else values
  nodes = np.flatnonzero(batch.gen_mask[b])
  n = len(nodes)
  big_g, big_l, live = np.ones(n), np.ones(n), np.zeros(n)
  for i in range(n - 1):
    if not batch.dones[b, nodes[i]]:
      live[i] = 1.0
      if batch.turn_ids[b, nodes[i + 1]] != batch.turn_ids[b, nodes[i]]:
        big_g[i], big_l[i] = gamma, lam
  v = values[b, nodes].astype(np.float64)
  v_next = np.append(v[1:], 0.0)
  delta = batch.rewards[b, nodes] + big_g * live * v_next - v
  return Chain(nodes, big_g, big_l, live, big_g * big_l * live, delta)


def weights(w):
  """W[j, k] = Π_{i=j}^{k−1} w_i (empty product 1), for k ≥ j; 0 below the diagonal."""
  n = len(w)
  out = np.zeros((n, n))
  for j in range(n):
    out[j, j] = 1.0
    for k in range(j + 1, n):
      out[j, k] = out[j, k - 1] * w[k - 1]
  return out


# ------------------------------------------------------------------------------------------- batches


class Batch(NamedTuple):
  values: np.ndarray  # (B, T) float32
  rewards: np.ndarray
  turn_ids: np.ndarray  # int32
  gen_mask: np.ndarray  # bool
  dones: np.ndarray  # bool
  real: np.ndarray  # bool: prompt, observation or generated (not padding)
  turn_key: np.ndarray  # int: a row-unique id of the (episode, turn) of a generated token, -1 elsewhere


@st.composite
def batches(draw, n_rows=B, n_tok=T, reward_mode=None, garbage=True, respect_packing=True, obs=True,
            fill=None):
  """Rows of packed episodes: [prompt] ([gen]+ [obs]*)+ per episode, then padding, cut at n_tok.

  garbage: unmasked positions hold random values, turn ids, dones (and rewards): they must never be read.
  respect_packing: only the last episode of a row may end without termination (SPEC §2's precondition).
  """
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  mode = reward_mode or draw(st.sampled_from(["dense", "sparse"]))
  shape = (n_rows, n_tok)
  values = rng.normal(size=shape).astype(np.float32)
  rewards = (rng.normal(size=shape) if garbage else np.zeros(shape)).astype(np.float32)
  turn_ids = rng.integers(-3, 12, size=shape).astype(np.int32) if garbage else np.zeros(shape, np.int32)
  dones = (rng.random(shape) < 0.3) if garbage else np.zeros(shape, bool)
  gen = np.zeros(shape, bool)
  real = np.zeros(shape, bool)
  turn_key = np.full(shape, -1)
  for b in range(n_rows):
    toks = []  # ("o",) or ("g", turn id, turn key, last of turn, done)
    restart = draw(st.booleans())
    turn, key = 0, 0
    n_eps = draw(st.integers(0, 3))
    for e in range(n_eps):
      if restart:
        turn = draw(st.integers(0, 2))
      toks += [("o",)] * (draw(st.integers(0, 3)) if obs else 0)  # prompt
      for _ in range(draw(st.integers(1, 4))):
        n_gen = draw(st.integers(1, 5))
        toks += [("g", turn, key, i == n_gen - 1, False) for i in range(n_gen)]
        toks += [("o",)] * (draw(st.integers(0, 4)) if obs else 0)  # observation
        turn, key = turn + 1, key + 1
      last_ep = e == n_eps - 1
      terminated = True if (respect_packing and not last_ep) else draw(st.booleans())
      if terminated:
        i = max(i for i, x in enumerate(toks) if x[0] == "g")
        toks[i] = toks[i][:4] + (True,)
    if fill is not None:
      toks = toks + [("o",)] * max(0, fill - len(toks))
    for j, x in enumerate(toks[:n_tok]):
      real[b, j] = True
      if x[0] == "g":
        _, turn_ids[b, j], turn_key[b, j], last, dones[b, j] = x
        gen[b, j] = True
        if mode == "dense":
          rewards[b, j] = rng.normal() if rng.random() < 0.3 else 0.0
        else:  # sparse: one reward per turn, on its last generated token
          rewards[b, j] = rng.normal() if last else 0.0
  return Batch(values, rewards, turn_ids, gen, dones, real, turn_key)


clock = st.one_of(st.sampled_from([0.0, 0.5, 0.9, 1.0]), st.floats(0.0, 1.0))


@st.composite
def carries(draw, n_rows=B):
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  present = np.array([draw(st.booleans()) for _ in range(n_rows)])
  return TBGAECarry(value=rng.normal(size=n_rows).astype(np.float32),
                    advantage=rng.normal(size=n_rows).astype(np.float32),
                    turn_id=rng.integers(0, 8, size=n_rows).astype(np.int32), present=present)


def run_tb(fn, batch, gamma, lam, carry=None):
  if carry is None:
    carry = TBGAECarry.empty(batch.values.shape[0])
  return fn(batch.values, batch.rewards, batch.turn_ids, batch.gen_mask, batch.dones, gamma, lam, carry)


# ------------------------------------------------------------------------------- against the references


@SETTINGS
@given(batch=batches(respect_packing=False), gamma=clock, lam=clock, carry=carries(),
       use_carry=st.booleans())
def test_tb_gae_matches_slow_reference(batch, gamma, lam, carry, use_carry):
  carry = carry if use_carry else None
  adv, ret, out = ref_tb_gae(batch.values, batch.rewards, batch.turn_ids, batch.gen_mask, batch.dones,
                             gamma, lam, carry)
  for name, fn in TB_IMPLS.items():
    res = run_tb(fn, batch, gamma, lam, carry)
    np.testing.assert_allclose(res.advantages, adv, **TOL, err_msg=name)
    np.testing.assert_allclose(res.returns, ret, **TOL, err_msg=name)
    assert res.advantages.dtype == res.returns.dtype == jnp.float32
    for b, succ in enumerate(out):
      assert bool(res.carry.present[b]) == (succ is not None), name
      if succ is not None:
        np.testing.assert_allclose([res.carry.value[b], res.carry.advantage[b]], succ[:2], **TOL)
        assert int(res.carry.turn_id[b]) == succ[2]


@SETTINGS
@given(batch=batches(respect_packing=False), gamma=clock, lam=clock, on_gen=st.booleans(),
       bootstrap=st.one_of(st.none(), st.lists(st.floats(-3, 3), min_size=B, max_size=B)))
def test_gae_matches_slow_reference(batch, gamma, lam, on_gen, bootstrap):
  mask = batch.gen_mask if on_gen else batch.real  # skip-observation vs interleaved-chain GAE
  boot = None if bootstrap is None else np.asarray(bootstrap, np.float32)
  adv, ret = ref_gae(batch.values, batch.rewards, batch.dones, mask, gamma, lam, boot)
  for name, fn in GAE_IMPLS.items():
    a, g = fn(batch.values, batch.rewards, batch.dones, mask, gamma, lam, boot)
    np.testing.assert_allclose(a, adv, **TOL, err_msg=name)
    np.testing.assert_allclose(g, ret, **TOL, err_msg=name)


RLAX_GAE = jax.jit(jax.vmap(rlax.truncated_generalized_advantage_estimation, in_axes=(0, 0, None, 0)))


@SETTINGS
@given(batch=batches(respect_packing=False), gamma=clock, lam=clock, with_bootstrap=st.booleans())
def test_gae_on_gen_mask_equals_rlax_on_compacted_tokens(batch, gamma, lam, with_bootstrap):
  # rlax on the generated tokens alone, moved to the front; values[L] is the bootstrap (0 unless given).
  # The padding after them (r = 0, discount 1, v = the bootstrap) has δ = 0, so it adds nothing.
  boot = np.linspace(-1, 1, B).astype(np.float32) if with_bootstrap else np.zeros(B, np.float32)
  r = np.zeros((B, T), np.float32)
  disc = np.ones((B, T), np.float32)
  v = np.repeat(boot[:, None], T + 1, axis=1)
  for b in range(B):
    idx = np.flatnonzero(batch.gen_mask[b])
    n = len(idx)
    r[b, :n] = batch.rewards[b, idx]
    disc[b, :n] = gamma * (1.0 - batch.dones[b, idx])
    v[b, :n] = batch.values[b, idx]
  boot = boot if with_bootstrap else None
  want = np.asarray(RLAX_GAE(r, disc, lam, v))
  a, _ = GAE(batch.values, batch.rewards, batch.dones, batch.gen_mask, gamma, lam, boot)
  for b in range(B):
    idx = np.flatnonzero(batch.gen_mask[b])
    np.testing.assert_allclose(np.asarray(a)[b, idx], want[b, :len(idx)], **TOL)


@SETTINGS
@given(batch=batches(), gamma=clock, lam=clock)
def test_tb_gae_clocks_reduce_to_gae(batch, gamma, lam):
  # Unit turn clocks: TB-GAE = skip-observation GAE with γ = λ = 1 (paper §2.3, App. C).
  tb = run_tb(TB, batch, 1.0, 1.0)
  a, g = GAE(batch.values, batch.rewards, batch.dones, batch.gen_mask, 1.0, 1.0)
  np.testing.assert_allclose(tb.advantages, a, **TOL)
  np.testing.assert_allclose(tb.returns, g, **TOL)
  # Every generated token its own turn: TB-GAE = token-clock GAE with (γ, λ) = (γ_turn, λ_turn).
  own = batch._replace(turn_ids=np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)))
  tb = run_tb(TB, own, gamma, lam)
  a, _ = GAE(batch.values, batch.rewards, batch.dones, batch.gen_mask, gamma, lam)
  np.testing.assert_allclose(tb.advantages, a, **TOL)


# ----------------------------------------------------------------------------------- paper identities


@SETTINGS
@given(batch=batches(respect_packing=False), gamma=clock, lam=clock)
def test_eq10_advantage_is_weighted_sum_of_residuals(batch, gamma, lam):
  res = run_tb(TB, batch, gamma, lam)
  for b in range(B):
    c = chain(batch, b, gamma, lam)
    want = weights(c.w) @ c.delta  # A_j = Σ_k W_{j,k} δ_k
    np.testing.assert_allclose(np.asarray(res.advantages)[b, c.nodes], want, **TOL)


@SETTINGS
@given(batch=batches(reward_mode="sparse"), gamma=clock, lam=clock)
def test_eq11_sparse_turn_reward_gives_shared_turn_return(batch, gamma, lam):
  res = run_tb(TB, batch, gamma, lam)
  adv, ret = np.asarray(res.advantages), np.asarray(res.returns)
  for b in range(B):
    nodes = np.flatnonzero(batch.gen_mask[b])
    for key in np.unique(batch.turn_key[b, nodes]):
      turn = nodes[batch.turn_key[b, nodes] == key]
      last = turn[-1]
      r_t, d_t = float(batch.rewards[b, last]), bool(batch.dones[b, last])
      later = nodes[nodes > last]
      if len(later) and not d_t:  # n starts the next turn (a boundary: turn ids strictly change)
        n = later[0]
        u = r_t + gamma * (batch.values[b, n] + lam * adv[b, n])  # Eq. 11
      else:
        u = r_t
      np.testing.assert_allclose(ret[b, turn], u, **TOL)  # Ĝ_j = U_t
      np.testing.assert_allclose(adv[b, turn], u - batch.values[b, turn], **TOL)  # A_j = U_t − v_j


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches(), gamma=clock, lam=clock, split=st.sampled_from([T // 4, T // 2, 3 * T // 4]))
def test_eq12_value_only_cut_loses_weighted_successor_advantage(batch, gamma, lam, split):
  full = run_tb(TB, batch, gamma, lam)
  right = TB(*(x[:, split:] for x in batch[:5]), gamma, lam, TBGAECarry.empty(B))
  cut_carry = right.carry._replace(advantage=jnp.zeros(B))  # keep v_{b+1}, reset the trace
  cut = TB(*(x[:, :split] for x in batch[:5]), gamma, lam, cut_carry)
  diff = np.asarray(full.advantages)[:, :split] - np.asarray(cut.advantages)
  for b in range(B):
    c = chain(batch, b, gamma, lam)
    left = c.nodes < split
    n_left = int(left.sum())
    want = np.zeros(n_left)
    if n_left < len(c.nodes):  # b+1 exists: A_full − A_cut = W_{j,b+1} A_{b+1}
      w_to_b1 = weights(c.w)[:n_left, n_left]
      want = w_to_b1 * float(full.advantages[b, c.nodes[n_left]])
    np.testing.assert_allclose(diff[b, c.nodes[left]], want, **TOL)


@SETTINGS
@given(batch=batches(), gamma=clock, lam=clock, seed=st.integers(0, 2**32 - 1))
def test_eq13_critic_error_propagation(batch, gamma, lam, seed):
  # Complete chains (each ends in a termination or at the row end with no carry): e_L = 0.
  e = np.random.default_rng(seed).normal(size=(B, T)).astype(np.float32)
  v_true = batch.values - e
  approx = run_tb(TB, batch, gamma, lam)
  true = run_tb(TB, batch._replace(values=v_true), gamma, lam)
  delta_a = np.asarray(approx.advantages, np.float64) - np.asarray(true.advantages, np.float64)
  for b in range(B):
    c = chain(batch, b, gamma, lam)
    n = len(c.nodes)
    w_mat = weights(c.w)
    ek = e[b, c.nodes].astype(np.float64)
    want = -ek.copy()
    for j in range(n):
      for k in range(j + 1, n):
        b_jk = w_mat[j, k - 1] * c.big_g[k - 1] * c.live[k - 1]  # B_{j,k} = W_{j,k−1} Γ_{k−1}(1 − d_{k−1})
        want[j] += b_jk * (1.0 - c.big_l[k - 1]) * ek[k]  # Eq. 13
    np.testing.assert_allclose(delta_a[b, c.nodes], want, **TOL)
    if lam == 1.0:  # every Λ = 1: only the local critic error remains
      np.testing.assert_allclose(delta_a[b, c.nodes], -ek, **TOL)


@SETTINGS
@given(batch=batches())
def test_unit_clocks_give_reward_to_go_minus_value(batch):
  res = run_tb(TB, batch, 1.0, 1.0)
  for b in range(B):
    nodes = np.flatnonzero(batch.gen_mask[b])
    ends = np.flatnonzero(batch.dones[b, nodes])
    start = 0
    for end in list(ends) + [len(nodes) - 1]:  # episodes on the chain: up to a done, or the row end
      seg = nodes[start:end + 1]
      to_go = np.cumsum(batch.rewards[b, seg][::-1].astype(np.float64))[::-1]
      np.testing.assert_allclose(np.asarray(res.advantages)[b, seg], to_go - batch.values[b, seg], **TOL)
      start = end + 1


@SETTINGS
@given(turns=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 7)), min_size=1, max_size=6),
       gamma=clock, lam=clock, done=st.booleans())
def test_attenuation_is_per_turn_boundary_not_per_token(turns, gamma, lam, done):
  # v = 0 and one unit reward on the last generated token: A_j = W_{j,L−1} = (γλ)^B, B = boundaries crossed.
  n_tok = 6 * 13
  values = np.zeros((1, n_tok), np.float32)
  rewards = np.zeros_like(values)
  turn_ids = np.zeros((1, n_tok), np.int32)
  gen = np.zeros((1, n_tok), bool)
  dones = np.zeros((1, n_tok), bool)
  boundaries_after, pos = [], 0
  for t, (n_gen, n_obs) in enumerate(turns):
    gen[0, pos:pos + n_gen] = True
    turn_ids[0, pos:pos + n_gen] = t
    boundaries_after += [len(turns) - 1 - t] * n_gen
    pos += n_gen + n_obs
  last = np.flatnonzero(gen[0])[-1]
  rewards[0, last] = 1.0
  dones[0, last] = done
  res = TB(values, rewards, turn_ids, gen, dones, gamma, lam, TBGAECarry.empty(1))
  want = (gamma * lam) ** np.asarray(boundaries_after, np.float64)
  np.testing.assert_allclose(np.asarray(res.advantages)[0, gen[0]], want, **TOL)


@SETTINGS
@given(batch=batches(obs=False, garbage=False, n_tok=T // 2), gamma=clock, lam=clock, carry=carries(),
       seed=st.integers(0, 2**32 - 1))
def test_inserting_observation_tokens_changes_nothing(batch, gamma, lam, carry, seed):
  # Insert zero-reward observation tokens (arbitrary values, turn ids and dones) anywhere, then compare
  # generated positions. Both layouts are padded to T.
  rng = np.random.default_rng(seed)
  pad = T - T // 2

  def widen(x, fillv):
    return np.concatenate([x, np.full((B, pad), fillv, x.dtype)], axis=1)

  base = Batch(*(widen(x, f) for x, f in zip(batch, (0.0, 0.0, 0, False, False, False, -1))))
  ins = {k: np.zeros((B, T), x.dtype) for k, x in base._asdict().items()}
  for b in range(B):
    n_ins = rng.integers(0, pad + 1)
    where = np.sort(rng.choice(T, size=n_ins, replace=False)) if n_ins else np.array([], int)
    is_obs = np.zeros(T, bool)
    is_obs[where] = True
    src = np.flatnonzero(~is_obs)
    for k, x in base._asdict().items():
      ins[k][b, src] = x[b, :len(src)]
    ins["values"][b, is_obs] = rng.normal(size=n_ins) * 10
    ins["turn_ids"][b, is_obs] = rng.integers(-5, 50, size=n_ins)
    ins["dones"][b, is_obs] = rng.random(n_ins) < 0.5
  wide = Batch(**ins)
  for name, fn in TB_IMPLS.items():
    a = run_tb(fn, base, gamma, lam, carry)
    c = run_tb(fn, wide, gamma, lam, carry)
    for b in range(B):
      np.testing.assert_allclose(np.asarray(c.advantages)[b, wide.gen_mask[b]],
                                 np.asarray(a.advantages)[b, base.gen_mask[b]], **TOL, err_msg=name)
      np.testing.assert_allclose(np.asarray(c.returns)[b, wide.gen_mask[b]],
                                 np.asarray(a.returns)[b, base.gen_mask[b]], **TOL, err_msg=name)
      assert not np.asarray(c.advantages)[b, ~wide.gen_mask[b]].any()
    np.testing.assert_allclose(c.carry.value, a.carry.value, **TOL)
    np.testing.assert_allclose(c.carry.advantage, a.carry.advantage, **TOL)


def test_paper_appendix_c_turn_rewards_example():
  # Unit clocks, turn rewards 0.10 and 1.00, zero values: returns 1.10 and 1.00 (not 1.10 for both).
  gen = np.array([[1, 1, 0, 0, 1, 1, 1, 0]], bool)
  turn_ids = np.array([[0, 0, 0, 0, 1, 1, 1, 1]], np.int32)
  rewards = np.array([[0, 0.1, 0, 0, 0, 0, 1.0, 0]], np.float32)
  dones = np.array([[0, 0, 0, 0, 0, 0, 1, 0]], bool)
  res = TB(np.zeros((1, 8), np.float32), rewards, turn_ids, gen, dones, 1.0, 1.0, TBGAECarry.empty(1))
  np.testing.assert_allclose(res.returns[0], [1.1, 1.1, 0, 0, 1.0, 1.0, 1.0, 0], rtol=1e-6)


# ---------------------------------------------------------------------------- chunks and truncation


def _split_stack(batch, carry):
  """For every split s = 0..T: left part x[:, :s] padded on the right and right part x[:, s:] padded on the
  left, with mask-0 garbage, stacked into ((T+1)·B, T) arrays (fixed shape: one compile)."""
  rng = np.random.default_rng(0)
  lefts, rights = [], []
  for s in range(T + 1):
    left, right = [], []
    for i, x in enumerate(batch[:5]):
      junk = (rng.integers(0, 9, size=x.shape) if x.dtype == np.int32 else rng.normal(size=x.shape)
              ).astype(x.dtype)
      if i == 3:  # gen_mask: padding is never a node
        junk = np.zeros_like(x)
      left.append(np.concatenate([x[:, :s], junk[:, s:]], axis=1))
      right.append(np.concatenate([junk[:, :s], x[:, s:]], axis=1))
    lefts.append(left)
    rights.append(right)
  stack = lambda parts: [np.concatenate([p[i] for p in parts]) for i in range(5)]
  tiled = TBGAECarry(*(np.tile(np.asarray(f), T + 1) for f in carry))
  return stack(lefts), stack(rights), tiled


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches(respect_packing=False), gamma=clock, lam=clock, carry=carries())
def test_chunked_equals_unsplit_at_every_split_point(batch, gamma, lam, carry):
  left, right, tiled = _split_stack(batch, carry)
  for name, fn in TB_IMPLS.items():
    full = run_tb(fn, batch, gamma, lam, carry)
    r = fn(*right, gamma, lam, tiled)
    l = fn(*left, gamma, lam, r.carry)
    for s in range(T + 1):
      rows = slice(s * B, (s + 1) * B)
      adv = np.concatenate([np.asarray(l.advantages)[rows, :s], np.asarray(r.advantages)[rows, s:]], 1)
      ret = np.concatenate([np.asarray(l.returns)[rows, :s], np.asarray(r.returns)[rows, s:]], 1)
      # The scan repeats the same operations in the same order; the associative tree differs in rounding.
      tol = EXACT if name == "scan" else TOL
      np.testing.assert_allclose(adv, full.advantages, **tol, err_msg=f"{name} s={s}")
      np.testing.assert_allclose(ret, full.returns, **tol, err_msg=f"{name} s={s}")
      for f_full, f_chunk in zip(full.carry, l.carry):
        np.testing.assert_allclose(np.asarray(f_chunk)[rows], f_full, **tol)


def _example(seed):
  # A deterministic packed batch (observations, several turns, a done mid-row, a truncated row end).
  rng = np.random.default_rng(seed)
  gen = rng.random((B, T)) < 0.6
  turn_ids = np.cumsum(rng.random((B, T)) < 0.15, axis=1).astype(np.int32)
  dones = gen & (rng.random((B, T)) < 0.08)
  return Batch(rng.normal(size=(B, T)).astype(np.float32), rng.normal(size=(B, T)).astype(np.float32),
               turn_ids, gen, dones, np.ones((B, T), bool), np.full((B, T), -1))


@pytest.mark.parametrize("impl", sorted(TB_IMPLS))
def test_chunked_with_true_slices_and_three_chunks(impl):
  fn = TB_IMPLS[impl]
  batch = _example(3)
  full = run_tb(fn, batch, 0.9, 0.7)
  parts = [(0, 5), (5, 29), (29, T)]  # three chunks of different lengths, right to left
  carry = TBGAECarry.empty(B)
  advs = {}
  for lo, hi in reversed(parts):
    res = fn(*(x[:, lo:hi] for x in batch[:5]), 0.9, 0.7, carry)
    advs[lo] = np.asarray(res.advantages)
    carry = res.carry
  tol = EXACT if impl == "scan" else TOL
  np.testing.assert_allclose(np.concatenate([advs[lo] for lo, _ in parts], 1), full.advantages, **tol)
  for f_full, f_chunk in zip(full.carry, carry):
    np.testing.assert_allclose(f_chunk, f_full, **tol)


@pytest.mark.parametrize("impl", sorted(TB_IMPLS))
def test_chunk_without_generated_tokens_passes_carry_through(impl):
  fn = TB_IMPLS[impl]
  carry = TBGAECarry(np.array([1.5, -2.0], np.float32), np.array([0.25, 3.0], np.float32),
                     np.array([4, 7], np.int32), np.array([True, False]))
  z = np.zeros((2, 6), np.float32)
  res = fn(z + 9.0, z + 1.0, z.astype(np.int32), z.astype(bool), z.astype(bool), 0.5, 0.5, carry)
  assert not np.asarray(res.advantages).any() and not np.asarray(res.returns).any()
  for got, want in zip(res.carry, carry):
    np.testing.assert_array_equal(got, want)
  empty = fn(*(np.zeros((2, 0), d) for d in (np.float32, np.float32, np.int32, bool, bool)), 0.5, 0.5, carry)
  for got, want in zip(empty.carry, carry):
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("impl", sorted(TB_IMPLS))
def test_truncated_row_bootstraps_from_carry_terminated_row_does_not(impl):
  fn = TB_IMPLS[impl]
  gen = np.array([[1, 1, 1, 0]], bool)  # one turn, then an observation
  values = np.array([[0.5, 0.25, 1.0, 7.0]], np.float32)
  rewards = np.array([[0.0, 0.0, 0.3, 0.0]], np.float32)
  turns = np.zeros((1, 4), np.int32)
  carry = TBGAECarry(np.array([2.0], np.float32), np.array([-0.5], np.float32), np.array([1], np.int32),
                     np.array([True]))  # the next turn's first token, in the chunk to the right
  g, lam = 0.9, 0.8
  not_done = np.zeros((1, 4), bool)
  done = np.array([[0, 0, 1, 0]], bool)
  truncated = fn(values, rewards, turns, gen, not_done, g, lam, carry)
  a_last = 0.3 + g * 2.0 - 1.0 + g * lam * -0.5  # boundary clock (γ, λ) to the carry token
  np.testing.assert_allclose(truncated.advantages[0, 2], a_last, rtol=1e-6)
  np.testing.assert_allclose(truncated.advantages[0, 0], 0.3 + g * 2.0 + g * lam * -0.5 - 0.5, rtol=1e-6)
  terminated = fn(values, rewards, turns, gen, done, g, lam, carry)
  np.testing.assert_allclose(terminated.returns[0, :3], [0.3, 0.3, 0.3], rtol=1e-6)
  no_carry = fn(values, rewards, turns, gen, not_done, g, lam, TBGAECarry.empty(1))
  np.testing.assert_allclose(no_carry.returns[0, :3], [0.3, 0.3, 0.3], rtol=1e-6)
  # The same for token-clock GAE's value bootstrap.
  for fn_gae in GAE_IMPLS.values():
    a, _ = fn_gae(values, rewards, not_done, gen, g, lam, np.array([2.0], np.float32))
    np.testing.assert_allclose(a[0, 2], 0.3 + g * 2.0 - 1.0, rtol=1e-6)
    a, _ = fn_gae(values, rewards, done, gen, g, lam, np.array([2.0], np.float32))
    np.testing.assert_allclose(a[0, 2], 0.3 - 1.0, rtol=1e-6)


# ------------------------------------------------------------------------------------ transformations


def test_carry_none_equals_empty_carry_and_outputs_are_float32():
  batch = _example(5)
  args = (batch.values.astype(np.float64), batch.rewards.astype(jnp.bfloat16), batch.turn_ids,
          batch.gen_mask.astype(np.int32), batch.dones.astype(np.float32))
  for fn in (tb_gae, tb_gae_associative):
    a = fn(*args, 0.9, 0.5)
    b = fn(*args, 0.9, 0.5, TBGAECarry.empty(B))
    np.testing.assert_array_equal(a.advantages, b.advantages)
    assert a.advantages.dtype == a.returns.dtype == a.carry.value.dtype == jnp.float32
    assert a.carry.turn_id.dtype == jnp.int32 and a.carry.present.dtype == jnp.bool_
  adv, ret = gae(*args[:2], args[4], args[3], 0.9, 0.5)
  assert adv.dtype == ret.dtype == jnp.float32


def test_vmap_and_traced_clocks():
  stacked = [np.stack([x, x[::-1]]) for x in _example(7)[:5]]  # (2, B, T)
  gammas = np.array([0.9, 0.6], np.float32)
  for fn in (tb_gae, tb_gae_associative):
    out = jax.jit(jax.vmap(lambda v, r, t, m, d, g: fn(v, r, t, m, d, g, 0.8)))(*stacked, gammas)
    for i in range(2):
      one = fn(*(x[i] for x in stacked), float(gammas[i]), 0.8)
      np.testing.assert_allclose(out.advantages[i], one.advantages, rtol=1e-6, atol=1e-6)
  out = jax.vmap(lambda v, r, d, m: gae(v, r, d, m, 0.9, 0.9))(stacked[0], stacked[1], stacked[4],
                                                               stacked[3])
  np.testing.assert_allclose(out[0][1], gae(stacked[0][1], stacked[1][1], stacked[4][1], stacked[3][1],
                                            0.9, 0.9)[0], rtol=1e-6, atol=1e-6)


def test_long_row_scan_and_associative_agree():
  # One long packed row: the associative variant matches the sequential scan to float32 rounding.
  rng = np.random.default_rng(11)
  n = 1 << 12
  gen = rng.random((1, n)) < 0.7
  turns = np.cumsum(rng.random((1, n)) < 0.01, axis=1).astype(np.int32)
  values = rng.normal(size=(1, n)).astype(np.float32)
  rewards = np.where(rng.random((1, n)) < 0.01, rng.normal(size=(1, n)), 0).astype(np.float32)
  carry = TBGAECarry.empty(1)
  for dones, g, lam in ((gen & (rng.random((1, n)) < 1e-3), 0.98, 0.95),
                        (np.zeros((1, n), bool), 1.0, 1.0)):  # unit clocks: reward-to-go over ~3k tokens
    a = TB(values, rewards, turns, gen, dones, g, lam, carry)
    b = TB_ASSOC(values, rewards, turns, gen, dones, g, lam, carry)
    np.testing.assert_allclose(b.advantages, a.advantages, rtol=1e-4, atol=1e-4)
