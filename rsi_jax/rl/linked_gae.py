"""Episodes whose segments are linked rows: their turn clock on the host, then TB-GAE over them in one pass.

The pipeline's call (:func:`chained_tb_gae`); notation, sample layout and the recursion (Eq. 8–9) are those of
:mod:`rsi_jax.rl.advantages`. A row may continue into another row (``next_row``: the next segment of the same
episode after a summarization); the episode's retained chain runs through its segments in order, so one episode
is one recursion. The turn clock depends only on the mask, the turn ids and the links, so it is settled on the
host (:func:`clock_flags`: one byte per token saying node / done / new turn, where "new turn" is Eq. 8's
boundary on the edge j⁻ → j from the node's predecessor). The device then runs one linear recurrence per row in
the successor-side form

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
  Rows may also pack several episodes (the packing precondition of :func:`~rsi_jax.rl.advantages.tb_gae` holds
  per row).

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