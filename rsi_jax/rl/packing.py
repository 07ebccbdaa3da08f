"""Learner passes: token-budget packing, dynamic balancing and micro-batches (paper App. A: per-device token
budget 8,192, padding to multiples of 2,048, dynamic sample balancing and micro-batch size one in RPR-2).

The learner's batch is a list of *samples* (the rows of :func:`rsi_jax.rl.batch.assemble_batch`: one linear
segment each, the unit of Eq. 14's sample-level mean E_j). A :class:`PassPlan` lays them out for the mesh:

- Each of the ``shards`` data shards (mesh data x fsdp) takes a share of the samples: a contiguous block in
  order, or, with ``balance`` (``rl.dynamic_balancing``), the longest-first assignment to the shard holding
  the fewest tokens so far, so no shard waits on another.
- ``token_budget`` > 0 (``rl.per_device_token_budget``): a shard's samples are packed into rows of at most
  that many tokens (first-fit decreasing with ``balance``, in order without), each sample a segment of its
  row with its own segment id, so attention never crosses samples (MaxText's segment mask) and positions
  restart at 0. A sample longer than the budget has a row of its own. A *pass* gives every shard one row:
  the budget is what one device holds in one forward/backward pass.
- ``token_budget`` = 0: one sample per row, every shard's rows in one pass (row count rounded up to a power
  of two: a bounded set of compiled shapes).
- ``micro_batch`` > 0 (``pipeline.micro_batch``): at most that many samples per shard in one pass (per row
  when packing).

The row length T is the longest row's token count rounded up to ``pad_multiple``. Gradients of a minibatch's
passes are accumulated (float32) into one optimizer update; with the losses normalised by the minibatch's
sample count (not the pass's), the accumulated loss and gradient equal the unpacked single-pass ones.

Index arrays move per-token data between the *sample layout* (S, Ts) (one sample per row, where TB-GAE runs
and segments link through ``next_row``) and the *packed layout* (passes, R, T) (what the model computes).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class PassPlan:
  """Samples laid out in passes. ``rows[p][r]``: the sample indices of row r (shard-major: shard
  r // rows_per_shard) of pass p, in order along the row; an empty tuple is a padding row."""
  rows: tuple[tuple[tuple[int, ...], ...], ...]
  shards: int
  rows_per_shard: int
  length: int  # T of every row
  lengths: tuple[int, ...]  # tokens of each sample (the sample layout's index)

  @property
  def passes(self) -> int:
    return len(self.rows)

  @property
  def rows_per_pass(self) -> int:
    return self.shards * self.rows_per_shard

  @property
  def samples(self) -> list[int]:
    return [s for p in self.rows for r in p for s in r]

  def shard_tokens(self) -> np.ndarray:
    """(passes, shards) real tokens each shard computes in each pass."""
    out = np.zeros((self.passes, self.shards), np.int64)
    for p, rows in enumerate(self.rows):
      for r, row in enumerate(rows):
        out[p, r // self.rows_per_shard] += sum(self.lengths[s] for s in row)
    return out

  def stats(self) -> dict:
    """``packing/efficiency``: real tokens / computed positions (passes x R x T); ``packing/passes``;
    ``packing/row_length``; ``packing/shard_imbalance``: the busiest shard's tokens over the mean shard's
    (summed over passes; 1.0 = balanced)."""
    tok = self.shard_tokens()
    total = int(tok.sum())
    per_shard = tok.sum(0)
    return {"packing/efficiency": total / max(self.passes * self.rows_per_pass * self.length, 1),
            "packing/passes": self.passes, "packing/row_length": self.length,
            "packing/shard_imbalance": float(per_shard.max() / max(per_shard.mean(), 1e-9)) if total else 1.0}


def plan_passes(lengths: Sequence[int], *, shards: int, token_budget: int = 0, micro_batch: int = 0,
                pad_multiple: int = 1, balance: bool = False, samples: Sequence[int] | None = None) -> PassPlan:
  """Lay out ``samples`` (default: every index of ``lengths`` with length > 0) in passes (module docstring).

  Args:
    lengths: tokens of every sample of the sample layout.
    shards: data shards of the mesh (data x fsdp); every pass has ``shards x rows_per_shard`` rows.
    token_budget: most tokens in one packed row (0 = no packing: one sample per row).
    micro_batch: most samples per shard in one pass (0 = no limit).
    pad_multiple: T is rounded up to a multiple of this.
    balance: dynamic balancing across shards (and first-fit-decreasing packing within one).
  """
  if shards <= 0 or token_budget < 0 or micro_batch < 0 or pad_multiple <= 0:
    raise ValueError(f"plan_passes: shards={shards} token_budget={token_budget} micro_batch={micro_batch} "
                     f"pad_multiple={pad_multiple}")
  lengths = tuple(int(n) for n in lengths)
  order = [i for i in range(len(lengths)) if lengths[i] > 0] if samples is None else [int(i) for i in samples]
  if any(lengths[i] <= 0 for i in order):
    raise ValueError("plan_passes: a planned sample has no tokens")
  per_shard = _assign(order, lengths, shards, balance)
  if token_budget > 0:
    shard_rows = [_pack(ss, lengths, token_budget, micro_batch, balance) for ss in per_shard]
    rows_per_shard = 1
  else:
    shard_rows = [[(s,) for s in ss] for ss in per_shard]
    most = max((len(r) for r in shard_rows), default=0)
    rows_per_shard = unpacked_rows_per_shard(most, micro_batch)
  n_pass = max([-(-len(r) // rows_per_shard) for r in shard_rows] + [1])
  rows = []
  for p in range(n_pass):
    pass_rows = []
    for d in range(shards):
      chunk = shard_rows[d][p * rows_per_shard:(p + 1) * rows_per_shard]
      pass_rows.extend(list(chunk) + [()] * (rows_per_shard - len(chunk)))
    rows.append(tuple(pass_rows))
  fill = max([sum(lengths[s] for s in r) for p in rows for r in p] + [1])
  t = -(-fill // pad_multiple) * pad_multiple
  return PassPlan(tuple(rows), shards, rows_per_shard, t, lengths)


def unpacked_rows_per_shard(samples_per_shard: int, micro_batch: int) -> int:
  """Rows each shard holds in one pass without packing: ``micro_batch``, or all of its samples in one pass,
  rounded up to a power of two (a bounded set of compiled shapes)."""
  return micro_batch if micro_batch > 0 else 1 << max(samples_per_shard - 1, 0).bit_length()


def _assign(order: list[int], lengths, shards: int, balance: bool) -> list[list[int]]:
  if not balance:  # contiguous blocks of (nearly) equal sample counts, in order
    q, r = divmod(len(order), shards)
    out, start = [], 0
    for d in range(shards):
      n = q + (d < r)
      out.append(order[start:start + n])
      start += n
    return out
  # longest first, each to the shard with the fewest tokens (ties: fewer samples, lower index)
  heap = [(0, 0, d) for d in range(shards)]
  out = [[] for _ in range(shards)]
  for s in sorted(order, key=lambda i: (-lengths[i], i)):
    tok, cnt, d = heapq.heappop(heap)
    out[d].append(s)
    heapq.heappush(heap, (tok + lengths[s], cnt + 1, d))
  return out


def _pack(samples: list[int], lengths, budget: int, micro_batch: int, first_fit: bool) -> list[tuple[int, ...]]:
  cap = micro_batch if micro_batch > 0 else len(samples) + 1
  rows: list[list[int]] = []
  fill: list[int] = []
  seq = sorted(samples, key=lambda i: (-lengths[i], i)) if first_fit else samples
  for s in seq:
    n = lengths[s]
    cand = range(len(rows)) if first_fit else range(max(len(rows) - 1, 0), len(rows))
    k = next((k for k in cand if fill[k] + n <= budget and len(rows[k]) < cap), None)
    if k is None:
      rows.append([s])
      fill.append(n)
    else:
      rows[k].append(s)
      fill[k] += n
  return [tuple(r) for r in rows]


@dataclasses.dataclass(frozen=True)
class PassIndex:
  """Index arrays of a plan for a sample layout of width ``ts``.

  gather (P, R, T): flat index ``s * ts + j`` of the sample-layout position each packed position holds
  (-1: padding). segment_ids (P, R, T): 1, 2, ... per sample along a row (0: padding). positions (P, R, T):
  j within the sample. scatter (S, ts): flat index ``(p * R + r) * T + t`` where sample position (s, j) is
  computed (-1: not planned or past the sample's length)."""
  gather: np.ndarray
  segment_ids: np.ndarray
  positions: np.ndarray
  scatter: np.ndarray


def pass_index(plan: PassPlan, ts: int) -> PassIndex:
  p_n, r_n, t = plan.passes, plan.rows_per_pass, plan.length
  gather = np.full((p_n, r_n, t), -1, np.int64)
  seg = np.zeros((p_n, r_n, t), np.int32)
  pos = np.zeros((p_n, r_n, t), np.int32)
  scatter = np.full((len(plan.lengths), ts), -1, np.int64)
  for p, rows in enumerate(plan.rows):
    for r, row in enumerate(rows):
      off = 0
      for k, s in enumerate(row, start=1):
        n = plan.lengths[s]
        if n > ts:
          raise ValueError(f"sample {s} has {n} tokens but the sample layout is {ts} wide")
        gather[p, r, off:off + n] = s * ts + np.arange(n)
        seg[p, r, off:off + n] = k
        pos[p, r, off:off + n] = np.arange(n)
        scatter[s, :n] = (p * r_n + r) * t + off + np.arange(n)
        off += n
  return PassIndex(gather, seg, pos, scatter)


def take(x, index):
  """``x.reshape(-1)[index]`` with 0 where ``index`` < 0 (numpy or jax arrays alike; differentiable)."""
  xp = np if isinstance(x, np.ndarray) and isinstance(index, np.ndarray) else jnp
  valid = index >= 0
  picked = x.reshape(-1)[xp.where(valid, index, 0)]
  return xp.where(valid, picked, xp.zeros((), picked.dtype))
