"""Credit assignment on the retained chain: token-clock GAE and TB-GAE (paper §2.3, App. C; SPEC §2).

Layout. Every array is a padded ``(B, T)`` token row; a row may pack several episodes. ``values[b, j]`` is
the critic's value of the prefix *before* token j, ``rewards[b, j]`` the reward r̃ placed on the generated
token that causally earned it, ``gen_mask`` marks policy-generated tokens (observations, prompt and padding
are 0), ``dones[b, j]`` is 1 on the last generated token of an episode that truly terminated, ``turn_ids``
says which turn a token belongs to.

Retained chain. Only positions with mask = 1 are recursion nodes. The successor j⁺ of a retained position j
is the next retained position in the same row; positions with mask = 0 are skipped, get advantage 0 and
return 0, and their values, rewards, dones and turn ids are never read (so inserting observation tokens
anywhere changes nothing). The successor of the last retained position of a row is the carry, if one is
given, else nothing. With ``d_j = 1`` or no successor, the successor value and trace are 0 (Eq. 9).

  clock (Eq. 8)      (Γ_j, Λ_j) = (1, 1) if t(j⁺) = t(j) else (γ_turn, λ_turn)
  recursion (Eq. 9)  δ_j = r̃_j + Γ_j (1 − d_j) v_{j⁺} − v_j
                     A_j = δ_j + w_j A_{j⁺},   w_j = Γ_j Λ_j (1 − d_j)
  target             Ĝ_j = A_j + v_j
  closed form        A_j = Σ_{k ≥ j} W_{j,k} δ_k,  W_{j,k} = Π_{i=j}^{k−1} w_i   (Eq. 10)

Token-clock GAE (:func:`gae`) is the same recursion with every step a "boundary": (Γ, Λ) = (γ, λ).

Packing precondition. Successors are found by position alone, so an episode that does *not* end in a true
termination (a sampling cut, a budget cut that the task does not define as terminal) must be the last
episode of its row: packed after it, the next episode would become its continuation. Terminated episodes
(``d = 1`` on their last generated token) can be packed freely.

Exact chunk continuation (Eq. 12). A row split into chunks and processed right to left reproduces the
unsplit result exactly when each chunk receives the :class:`TBGAECarry` returned by the chunk to its right:
the value, advantage and turn id of the first retained token to its right, and whether there is one. The
value alone (a truncated-GAE bootstrap with the trace reset) loses ``W_{j,b+1} A_{b+1}`` (Eq. 12).

Two implementations with the same results: a reverse ``jax.lax.scan`` over the token axis (the reference,
O(T) sequential steps over (B,) vectors) and a ``jax.lax.associative_scan`` variant (O(log T) depth; the
recursion is a first-order linear recurrence A_j = δ_j + w_j A_{j+1} once skipped positions become the
identity map), for very long rows. They agree to float32 rounding, not bit for bit.

Episodes over linked segments (:func:`chained_tb_gae`, the pipeline's call). A row may continue into another
row (``next_row``: the next segment of the same episode after a summarization); the episode's retained chain
runs through its segments in order, so one episode is one recursion. The turn clock depends only on the mask,
the turn ids and the links, so it is settled on the host (:func:`clock_flags`: one byte per token saying
node / done / new turn, where "new turn" is Eq. 8's boundary on the edge j⁻ → j from the node's predecessor).
The device then runs one linear recurrence per row in the successor-side form

  y_k = Γ_{k⁻k} (v_k + Λ_{k⁻k} A_k)          what the predecessor k⁻ needs from k
  Y_j = c_j + a_j Y_{j+1}                      c_j = Γ v_j + ΓΛ (r̃_j − v_j), a_j = ΓΛ (1 − d_j) at a node
                                               (Γ, Λ of the edge into j); c_j = 0, a_j = 1 elsewhere, so
                                               Y_{j+1} = y_{j⁺} for a node j
  A_j = r̃_j − v_j + (1 − d_j) Y_{j+1}         Eq. 9

a single multiply-add per step over (B,) vectors. Rows are joined without moving them: each row's recurrence
is an affine map of the Y entering at its right end, Y_j = C_j + P_j Y_in with C from a zero start and
P = Π a; the Y_in of every row follows from its successors' (C at their start, P over the row) by pointer
doubling over the rows (⌈log2(B+1)⌉ steps, whatever the chain depth), and a second pass (the scan) or the
affine form itself (the associative scan) gives Y. Shapes are the sample layout's, so no chain structure
compiles anything new.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


class TBGAECarry(NamedTuple):
  """State handed from a chunk to the chunk on its left: the first retained token of the right part.

  Each field is ``(B,)``. ``present`` False means "no retained token to the right" (the other fields are
  then ignored), which is what ``carry=None`` means.
  """
  value: Array  # float32 v of that token
  advantage: Array  # float32 A of that token
  turn_id: Array  # int32 t of that token
  present: Array  # bool

  @classmethod
  def empty(cls, batch_size: int) -> TBGAECarry:
    """The carry of an empty right part: nothing to continue into."""
    return cls(value=jnp.zeros((batch_size,), jnp.float32),
               advantage=jnp.zeros((batch_size,), jnp.float32),
               turn_id=jnp.zeros((batch_size,), jnp.int32),
               present=jnp.zeros((batch_size,), bool))


class TBGAEResult(NamedTuple):
  advantages: Array  # (B, T) float32, 0 where gen_mask = 0
  returns: Array  # (B, T) float32 Ĝ = A + v, 0 where gen_mask = 0
  carry: TBGAECarry  # for the chunk to the left; the input carry if this chunk has no generated token


# ------------------------------------------------------------------------------------------- public API


def tb_gae(values, rewards, turn_ids, gen_mask, dones, gamma_turn=1.0, lambda_turn=1.0,
           carry: TBGAECarry | None = None) -> TBGAEResult:
  """Turn-Boundary Skip-Observation GAE (Eq. 8–9) as a reverse ``jax.lax.scan`` over the token axis.

  Args:
    values: (B, T) float, v_j = V(h_{u_j}), the value of the prefix before token j.
    rewards: (B, T) float, r̃_j on the generated token that earned it (read only where gen_mask = 1).
    turn_ids: (B, T) int, t(j); only equality between consecutive retained tokens matters.
    gen_mask: (B, T) bool/int, 1 = policy-generated token (a recursion node).
    dones: (B, T) bool/int, 1 on the last generated token of a truly terminated episode.
    gamma_turn, lambda_turn: scalars in [0, 1], the clock at a turn boundary (Eq. 8).
    carry: optional :class:`TBGAECarry` of (B,) arrays: the successor of each row's last generated token
      (from the chunk to the right). None = no successor (a row that ends without ``done`` and without a
      carry bootstraps 0).

  Returns:
    :class:`TBGAEResult` (advantages (B, T), returns (B, T), carry for the chunk to the left), float32.
  """
  return _tb_gae(values, rewards, turn_ids, gen_mask, dones, gamma_turn, lambda_turn, carry,
                 _reverse_scan)


def tb_gae_associative(values, rewards, turn_ids, gen_mask, dones, gamma_turn=1.0, lambda_turn=1.0,
                       carry: TBGAECarry | None = None) -> TBGAEResult:
  """:func:`tb_gae` computed with ``jax.lax.associative_scan`` (log-depth); same arguments and results.

  The fast path on accelerators: on one H200 it took 0.23 ms for both (256, 8192) and (1, 262144), where
  the sequential scan took 152 ms and 3.8 s (benchmarks/bench_gae.py). On CPU the scan is faster (about 2×)
  and compiles faster, so prefer :func:`tb_gae` there.
  """
  return _tb_gae(values, rewards, turn_ids, gen_mask, dones, gamma_turn, lambda_turn, carry,
                 _associative)


def gae(values, rewards, dones, mask, gamma, lam, bootstrap_value=None):
  """Token-clock GAE over the positions where mask = 1 (Schulman et al.; paper §2.3 "standard GAE").

  δ_j = r_j + γ(1 − d_j) v_{j⁺} − v_j,  A_j = δ_j + γλ(1 − d_j) A_{j⁺}, with j⁺ the next position of the row
  where mask = 1. ``mask`` = all real tokens gives interleaved-chain GAE (observations are nodes);
  ``mask`` = gen_mask gives skip-observation GAE. Unmasked positions get 0 and are never read.

  Args:
    values, rewards: (B, T) float.  dones, mask: (B, T) bool/int.  gamma, lam: scalars.
    bootstrap_value: optional (B,) float, the successor value of each row's last masked position (a
      truncated row); its trace is 0. None = successor value 0.

  Returns:
    (advantages, returns), each (B, T) float32, 0 where mask = 0.
  """
  res = _tb_gae(values, rewards, _token_clock_ids(values), mask, dones, gamma, lam,
                _bootstrap_carry(values, bootstrap_value), _reverse_scan)
  return res.advantages, res.returns


def gae_associative(values, rewards, dones, mask, gamma, lam, bootstrap_value=None):
  """:func:`gae` computed with ``jax.lax.associative_scan``; same arguments and results."""
  res = _tb_gae(values, rewards, _token_clock_ids(values), mask, dones, gamma, lam,
                _bootstrap_carry(values, bootstrap_value), _associative)
  return res.advantages, res.returns


# --------------------------------------------------------------------------- episodes over linked segments

GAE_IMPLS = ("scan", "associative", "auto")
NODE, DONE, NEW_TURN = 1, 2, 4  # bits of :func:`clock_flags`


class ChainedResult(NamedTuple):
  advantages: Array  # (B, T) float32, 0 where gen_mask = 0
  returns: Array  # (B, T) float32 Ĝ = A + v, 0 where gen_mask = 0


def gae_impl(name: str) -> str:
  """``scan`` or ``associative`` for a ``rl.gae_impl`` value; ``auto``: the associative scan on accelerators
  (log depth), the sequential scan on CPU (fewer passes over memory)."""
  if name not in GAE_IMPLS:
    raise ValueError(f"gae_impl must be one of {', '.join(GAE_IMPLS)}, got {name!r}")
  if name == "auto":
    return "associative" if jax.default_backend() != "cpu" else "scan"
  return name


def chain_predecessors(next_row) -> np.ndarray:
  """(B,) int: the row each row continues (-1 for an episode's first segment), from ``next_row`` (row i
  continues into row ``next_row[i]``, -1 = none). Raises ValueError for a link outside the batch, a row
  continued by two rows, or a cycle."""
  nxt = np.asarray(next_row).astype(np.int64).reshape(-1)
  n = len(nxt)
  prev = np.full(n, -1, np.int64)
  for i in np.flatnonzero(nxt != -1):
    j = int(nxt[i])
    if not 0 <= j < n:
      raise ValueError(f"next_row: row {i} continues into row {j}, outside the batch's {n} rows")
    if prev[j] >= 0:
      raise ValueError(f"next_row: row {j} continues two rows ({prev[j]} and {i})")
    prev[j] = i
  reached = np.zeros(n, bool)
  for h in np.flatnonzero(prev < 0):  # walk every episode from its first segment
    j = int(h)
    while j >= 0:
      reached[j], j = True, int(nxt[j])
  if not reached.all():
    raise ValueError(f"next_row: rows {np.flatnonzero(~reached)[:8].tolist()} form a cycle")
  return prev


def clock_flags(gen_mask, turn_ids, dones, next_row) -> np.ndarray:
  """Host side (numpy): the turn clock of a batch of linked segments, one uint8 per token (Eq. 8).

  Bits: ``NODE`` (gen_mask = 1), ``DONE`` (d = 1 on a node), ``NEW_TURN`` (the node's turn id differs from its
  predecessor's: the clock on the edge j⁻ → j is (γ_turn, λ_turn)). A node's predecessor j⁻ is the previous
  node of its row or, for a row's first node, the last node of the segment it continues (``next_row``,
  through segments without nodes); a node without one has ``NEW_TURN`` clear (nothing reads it). Only nodes'
  turn ids and dones are read.

  Args:
    gen_mask, turn_ids, dones: (B, T) arrays of the sample layout.  next_row: (B,) int, -1 = no continuation.
  Returns:
    (B, T) uint8.
  """
  m = np.asarray(gen_mask) > 0
  b, t = m.shape
  prev = chain_predecessors(next_row)
  if prev.shape[0] != b:
    raise ValueError(f"next_row has {prev.shape[0]} rows, gen_mask {b}")
  turn = np.asarray(turn_ids)
  flags = m.astype(np.uint8) * NODE | (m & (np.asarray(dones) > 0)).astype(np.uint8) * DONE
  # a node right after a node: compare neighbours
  flags[:, 1:] |= (m[:, 1:] & m[:, :-1] & (turn[:, 1:] != turn[:, :-1])).astype(np.uint8) * NEW_TURN
  # a node after a gap (observations, the row start): its predecessor ends the previous run of nodes
  start, end = m.copy(), m.copy()
  start[:, 1:] &= ~m[:, :-1]
  end[:, :-1] &= ~m[:, 1:]
  start, end = np.flatnonzero(start), np.flatnonzero(end)  # run k of the batch: nodes start[k]..end[k]
  if not len(start):
    return flags
  row = start // t
  first = np.ones(len(start), bool)  # the row's first run
  first[1:] = row[1:] != row[:-1]
  turn = turn.reshape(-1)
  pred = np.full(len(start), -1, np.int64)  # flat position of each run's predecessor node, -1 = none
  pred[1:] = np.where(first[1:], -1, end[:-1])
  last = np.full(b, -1, np.int64)  # each row's last node
  final = np.r_[first[1:], True]  # the row's last run
  last[row[final]] = end[final]
  for k in np.flatnonzero(first):  # a row's first node continues the episode's previous segment with nodes
    q = prev[row[k]]
    while q >= 0 and last[q] < 0:  # a segment without nodes passes its predecessor through
      q = prev[q]
    pred[k] = last[q] if q >= 0 else -1
  new = (pred >= 0) & (turn.take(start) != turn.take(np.maximum(pred, 0)))
  flags.reshape(-1)[start[new]] |= NEW_TURN
  return flags


def chained_tb_gae(values, rewards, flags, next_row, gamma_turn=1.0, lambda_turn=1.0, links=None,
                   impl: str = "scan") -> ChainedResult:
  """TB-GAE (Eq. 8–9) over episodes whose segments are linked rows, one pass over the tokens.

  Row i continues into row ``next_row[i]``: its last node's successor is the first node of the next segment
  of the episode that has nodes, exactly as if the segments were one row (the chunk continuation of Eq. 12).
  Rows may also pack several episodes (the packing precondition of :func:`tb_gae` holds per row).

  Args:
    values: (B, T) float, v_j.  rewards: (B, T) float, r̃_j.
    flags: (B, T) uint8 from :func:`clock_flags` (nodes, dones and turn boundaries).
    next_row: (B,) int, -1 = the episode's last segment (no successor beyond the row).
    gamma_turn, lambda_turn: scalars in [0, 1], the clock at a turn boundary.
    links: None = whole episodes; an int k = each row sees at most k following segments (0: every row ends at
      its own end, as without ``next_row``). May be traced.
    impl: ``scan`` (reverse ``lax.scan``) or ``associative`` (``lax.associative_scan``); static.

  Returns:
    :class:`ChainedResult`: advantages and returns (B, T) float32, 0 off the nodes.
  """
  if impl not in ("scan", "associative"):
    raise ValueError(f"impl must be 'scan' or 'associative', got {impl!r}")
  chex.assert_rank([values, rewards, flags], 2)
  chex.assert_equal_shape([values, rewards, flags])
  b, t = jnp.shape(values)
  chex.assert_shape(next_row, (b,))
  values = jnp.asarray(values, jnp.float32)
  rewards = jnp.asarray(rewards, jnp.float32)
  flags = jnp.asarray(flags)
  node = (flags & NODE) > 0
  keep = jnp.where((flags & DONE) > 0, 0.0, 1.0)  # 1 − d_j
  new_turn = (flags & NEW_TURN) > 0
  gamma_turn = jnp.asarray(gamma_turn, jnp.float32)
  lambda_turn = jnp.asarray(lambda_turn, jnp.float32)
  gamma_lambda = gamma_turn * lambda_turn
  # the clock of the edge into j (Eq. 8), applied on the successor's side: y_j = Γ (v_j + Λ A_j)
  c = jnp.where(node, jnp.where(new_turn, gamma_turn, 1.0) * values
                + jnp.where(new_turn, gamma_lambda, 1.0) * (rewards - values), 0.0)
  if t == 0:
    y_next = c
  elif impl == "scan":
    y_next = _chained_scan(c, flags, gamma_lambda, next_row, links)
  else:
    y_next = _chained_associative(c, _weight(flags, gamma_lambda), next_row, links)
  adv = jnp.where(node, (rewards - values) + keep * y_next, 0.0)  # Eq. 9; Y_{j+1} = y_{j⁺} at a node j
  return ChainedResult(adv, jnp.where(node, adv + values, 0.0))


# ------------------------------------------------------------------------------------------ internals


def _token_clock_ids(values):
  # Every position its own "turn": each retained step crosses a boundary, so (Γ, Λ) = (γ, λ) everywhere.
  b, t = jnp.shape(values)
  return jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))


def _bootstrap_carry(values, bootstrap_value):
  b, t = jnp.shape(values)
  if bootstrap_value is None:
    return None
  chex.assert_shape(bootstrap_value, (b,))
  # turn_id -1 differs from every position id, so the last step also uses (γ, λ); the trace is reset.
  return TBGAECarry(value=jnp.asarray(bootstrap_value, jnp.float32),
                    advantage=jnp.zeros((b,), jnp.float32),
                    turn_id=jnp.full((b,), -1, jnp.int32),
                    present=jnp.ones((b,), bool))


def _tb_gae(values, rewards, turn_ids, mask, dones, gamma_turn, lambda_turn, carry, impl):
  chex.assert_rank([values, rewards, turn_ids, mask, dones], 2)
  chex.assert_equal_shape([values, rewards, turn_ids, mask, dones])
  b, _ = jnp.shape(values)
  values = jnp.asarray(values, jnp.float32)
  rewards = jnp.asarray(rewards, jnp.float32)
  turn_ids = jnp.asarray(turn_ids, jnp.int32)
  mask = jnp.asarray(mask).astype(bool)
  dones = jnp.asarray(dones).astype(bool)
  gamma_turn = jnp.asarray(gamma_turn, jnp.float32)
  lambda_turn = jnp.asarray(lambda_turn, jnp.float32)
  if carry is None:
    carry = TBGAECarry.empty(b)
  chex.assert_shape(list(carry), (b,))
  carry = TBGAECarry(jnp.asarray(carry.value, jnp.float32), jnp.asarray(carry.advantage, jnp.float32),
                     jnp.asarray(carry.turn_id, jnp.int32), jnp.asarray(carry.present).astype(bool))
  return impl(values, rewards, turn_ids, mask, dones, gamma_turn, lambda_turn, carry)


def _reverse_scan(values, rewards, turn_ids, mask, dones, gamma_turn, lambda_turn, carry):
  gamma_lambda = gamma_turn * lambda_turn
  keep = (~dones).astype(jnp.float32)  # 1 − d_j
  # Everything that needs no successor is computed outside the loop; the loop body stays a few ops.
  xs = tuple(x.T for x in (values, rewards - values, keep, turn_ids, mask))  # scan over the token axis

  def step(nxt, x):
    v_n, a_n, t_n = nxt  # v_{j⁺}, A_{j⁺}, t(j⁺); v = A = 0 when there is no successor
    v, r_minus_v, nd, t, m = x
    boundary = t_n != t  # Eq. 8: (Γ_j, Λ_j) = (γ_turn, λ_turn) across a turn boundary, else (1, 1)
    clock_g = jnp.where(boundary, gamma_turn, 1.0)
    clock_gl = jnp.where(boundary, gamma_lambda, 1.0)
    # Eq. 9: A_j = δ_j + w_j A_{j⁺} = r̃_j − v_j + (1 − d_j)(Γ_j v_{j⁺} + Γ_j Λ_j A_{j⁺})
    a = r_minus_v + nd * (clock_g * v_n + clock_gl * a_n)
    # A skipped position leaves the successor untouched: it is not a node of the chain.
    return (jnp.where(m, v, v_n), jnp.where(m, a, a_n), jnp.where(m, t, t_n)), a

  init = (jnp.where(carry.present, carry.value, 0.0), jnp.where(carry.present, carry.advantage, 0.0),
          carry.turn_id)
  (v_f, a_f, t_f), a = jax.lax.scan(step, init, xs, reverse=True)
  a = a.T
  return TBGAEResult(jnp.where(mask, a, 0.0), jnp.where(mask, a + values, 0.0),
                     _carry_out(mask, carry, v_f, a_f, t_f))


def _carry_out(mask, carry, value, advantage, turn_id):
  """The first retained token's (v, A, t), or the incoming carry unchanged if the chunk has none."""
  any_node = mask.any(axis=1)
  return TBGAECarry(value=jnp.where(any_node, value, carry.value),
                    advantage=jnp.where(any_node, advantage, carry.advantage),
                    turn_id=jnp.where(any_node, turn_id, carry.turn_id),
                    present=any_node | carry.present)


def _associative(values, rewards, turn_ids, mask, dones, gamma_turn, lambda_turn, carry):
  b, t = values.shape
  if t == 0:  # an empty chunk passes the carry through
    return TBGAEResult(values, values, carry)
  pos = jnp.arange(t, dtype=jnp.int32)
  node = jnp.where(mask, pos, t)  # position of a retained token, t elsewhere
  # j⁺: the first retained position strictly after j; t means "the carry".
  after = jnp.concatenate([node[:, 1:], jnp.full((b, 1), t, jnp.int32)], axis=1)
  succ = jax.lax.cummin(after, axis=1, reverse=True)

  def ext(x, c):  # (B, T) row extended by the carry field at index t
    return jnp.concatenate([x, c[:, None]], axis=1)

  def at(x, idx):
    return jnp.take_along_axis(x, idx, axis=1)

  v_n = at(ext(values, jnp.where(carry.present, carry.value, 0.0)), succ)  # 0 when there is no successor
  t_n = at(ext(turn_ids, carry.turn_id), succ)
  boundary = t_n != turn_ids  # Eq. 8
  keep = (~dones).astype(jnp.float32)
  # Eq. 9 as an affine map per position, X_j = c_j + a_j X_{j+1}, with c_j = δ_j and a_j = w_j at retained
  # positions and the identity at skipped ones, so X_j = A_j at retained positions.
  delta = (rewards - values) + keep * (jnp.where(boundary, gamma_turn, 1.0) * v_n)
  w = keep * jnp.where(boundary, gamma_turn * lambda_turn, 1.0)
  a = jnp.where(mask, w, 1.0)
  c = jnp.where(mask, delta, 0.0)

  def compose(later, earlier):  # with reverse=True the accumulated (right) part comes first
    a_r, c_r = later
    a_l, c_l = earlier
    return a_l * a_r, c_l + a_l * c_r

  a_cum, c_cum = jax.lax.associative_scan(compose, (a, c), reverse=True, axis=1)
  x_end = jnp.where(carry.present, carry.advantage, 0.0)  # X_t: A of the carry token
  adv = c_cum + a_cum * x_end[:, None]
  first = jnp.min(node, axis=1, keepdims=True) % t  # any index when the chunk has no retained token
  out = _carry_out(mask, carry, at(values, first)[:, 0], at(adv, first)[:, 0], at(turn_ids, first)[:, 0])
  return TBGAEResult(jnp.where(mask, adv, 0.0), jnp.where(mask, adv + values, 0.0), out)


def _weight(flags, gamma_lambda):
  """a_j of :func:`chained_tb_gae` from its flags: Γ Λ (1 − d_j) at a node, 1 (the identity) elsewhere."""
  clock = jnp.where((flags & NEW_TURN) > 0, gamma_lambda, 1.0)
  return jnp.where((flags & NODE) > 0, jnp.where((flags & DONE) > 0, 0.0, clock), 1.0)


def _chained_scan(c, flags, gamma_lambda, next_row, links):
  """Y_{j+1} of :func:`chained_tb_gae` with reverse ``lax.scan`` over (c, flags) (a_j decoded in the step from
  the flag byte): a first pass for each row's map (C at its start, from Y_in = 0), the rows' Y_in, then the
  pass that keeps Y. The step is one multiply-add over (B,) vectors."""
  xs = (c.T, flags.T)

  def step(y, x):  # returns (Y_j, Y_{j+1})
    return x[0] + _weight(x[1], gamma_lambda) * y, y

  y_in = jnp.zeros(c.shape[:1], jnp.float32)
  if links is None or not isinstance(links, int) or links > 0:
    start, _ = jax.lax.scan(lambda y, x: (step(y, x)[0], None), y_in, xs, reverse=True)
    y_in = _link_rows(start, jnp.prod(_weight(flags, gamma_lambda), axis=1), next_row, links)
  _, y_next = jax.lax.scan(step, y_in, xs, reverse=True)
  return y_next.T


def _chained_associative(c, a, next_row, links):
  """Y_{j+1} of :func:`chained_tb_gae` with ``lax.associative_scan``: Y_j = C_j + P_j Y_in directly."""

  def compose(later, earlier):  # with reverse=True the accumulated (right) part comes first
    a_r, c_r = later
    a_l, c_l = earlier
    return a_l * a_r, c_l + a_l * c_r

  a_cum, c_cum = jax.lax.associative_scan(compose, (a, c), reverse=True, axis=1)
  y_in = _link_rows(c_cum[:, 0], a_cum[:, 0], next_row, links)
  y = c_cum + a_cum * y_in[:, None]
  return jnp.concatenate([y[:, 1:], y_in[:, None]], axis=1)


def _link_rows(start, prod, next_row, links):
  """Y_in of every row: Y_in(i) = g_{n(i)}(Y_in(n(i))) with g_j(y) = start_j + prod_j y and n = next_row
  (0 past an episode's last segment), by pointer doubling over the rows: level l holds each row's composition
  of the 2^l maps that follow it. ``links`` (None = all) limits the number of maps composed."""
  b = start.shape[0]
  levels = max(1, b.bit_length())  # 2^levels − 1 ≥ b − 1, the most links a chain can have
  nxt = jnp.asarray(next_row, jnp.int32)
  sink = b  # past an episode's end: the map y ↦ 0, pointing at itself
  ptr = jnp.concatenate([jnp.where((nxt >= 0) & (nxt < b), nxt, sink), jnp.array([sink], jnp.int32)])
  g_c = jnp.concatenate([start, jnp.zeros((1,), jnp.float32)])
  g_p = jnp.concatenate([prod, jnp.zeros((1,), jnp.float32)])
  f_c, f_p = g_c[ptr], g_p[ptr]  # level 0: each row's successor's map
  r_c, r_p = jnp.zeros((b + 1,), jnp.float32), jnp.ones((b + 1,), jnp.float32)  # composed so far (identity)
  at = jnp.arange(b + 1, dtype=jnp.int32)  # the row whose maps come next
  if links is not None:
    links = jnp.clip(jnp.asarray(links, jnp.int32), 0, 2**levels - 1)
  for level in range(levels):
    use = True if links is None else ((links >> level) & 1) > 0
    r_c, r_p, at = (jnp.where(use, r_c + r_p * f_c[at], r_c), jnp.where(use, r_p * f_p[at], r_p),
                    jnp.where(use, ptr[at], at))
    f_c, f_p, ptr = f_c + f_p * f_c[ptr], f_p * f_p[ptr], ptr[ptr]
  return r_c[:b]  # R(0)
