"""Paged KV memory, chunked prefill and prefix reuse for the sampler (``sampler.decode_impl: paged``).

Memory. The KV cache is one pool of ``kv_blocks`` fixed-size blocks per K and V,
``(layers, kv_blocks, block_size, kv_heads, head_dim)``. Each sequence owns a *block table*: entry j is the
pool block holding its positions ``[j * block_size, (j + 1) * block_size)``. Blocks are taken when a sequence
first writes into them, so memory follows the live tokens, not slots x maximum length. Unused table entries
hold ``kv_blocks`` (out of range): writes there are dropped.

Attention. Every query row reads only its own sequence's blocks up to its position (per-sequence extent):
the (sequence, block) pairs that some row needs are laid out as one flat list of work items, processed
``work`` items at a time with an online softmax whose partial results are merged per sequence (split-K, as
flash-decoding). A step costs the sum of the live extents, so a short sequence does not pay for the longest
one in the batch. A decode call whose sequences are all short, or alike in length, takes the gathered path
instead (:func:`gathered_attention`: each sequence's first blocks gathered into one row, one softmax): fewer,
larger operations, about 3x cheaper per position read on CPU; :meth:`PagedEngine.attention_plan` chooses by
the blocks each slot reads in the call.

Prefill. A prompt is written in chunks of ``prefill_chunk`` tokens, each attending to the sequence's earlier
blocks and causally within itself (:meth:`PagedEngine.prefill_chunk`); the server interleaves the chunks with
decode steps of the other slots. The last chunk samples the request's first token and activates its slot.
MaxText's own prefill (:meth:`Engine.prefill`) stays as the reference the tests compare with.

Prefix reuse (:class:`BlockPool`). A full block is identified by a chain hash of every token up to its end
(and the weight version), as in vLLM's automatic prefix caching. The full blocks of a prompt are
registered once its prefill is dispatched; those of the generated tokens when the request ends. A new
request takes the longest chain of registered blocks matching its prompt (automatic matching on token ids:
the harness needs no protocol change) and prefills only the rest; at least one token is always prefilled (its
logits sample the first token). Registered blocks nobody uses stay cached and are evicted least recently used
when a block is needed. A weight swap forgets every registration (old weights' keys are not reused).

Layer math: :func:`rsi_jax.sampler.slot_decode.qwen3_layers`, exactly MaxText's Qwen3 layer.
"""

from __future__ import annotations

import collections
import hashlib
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rsi_jax.sampler.engine import DecodeState, Engine, StepResult
from rsi_jax.sampler.sampling import sample_tokens, token_key
from rsi_jax.sampler.slot_decode import qwen3_layers


def paged_attention(q, k_pool, v_pool, layer, positions, block_tables, n_blocks, work: int, dtype):
  """softmax(q . k) v for every query row over its own sequence's cached entries ``<= position``.

  Args:
    q: (S, Q, K, G, D) queries of S sequences, Q rows each (decode: Q = 1; a prefill chunk: S = 1).
    k_pool, v_pool: (L, NB, bs, K, D) pools; ``layer`` selects L.
    positions: (S, Q) int32 position of each query row (a row sees keys at positions <= its own).
    block_tables: (S, B) int32 pool block of each sequence's j-th block.
    n_blocks: (S,) int32 blocks of each sequence to read (0: none; its rows come back as zeros).
    work: (sequence, block) pairs per iteration.
  Returns:
    (S, Q, K, G, D) float32.
  """
  s, nq, n_kv, g, d = q.shape
  bs = k_pool.shape[2]
  first = jnp.cumsum(n_blocks) - n_blocks  # (S,) index of each sequence's first work item
  total = jnp.sum(n_blocks)

  def chunk(c, carry):
    m, l, acc = carry  # (S, Q, K, G) running max and sum, (S, Q, K, G, D) accumulator
    item = c * work + jnp.arange(work, dtype=jnp.int32)
    live = item < total
    seq = jnp.clip(jnp.searchsorted(first, item, side="right") - 1, 0, s - 1)
    j = item - first[seq]
    blk = block_tables[seq, jnp.clip(j, 0, block_tables.shape[1] - 1)]
    kb = k_pool[layer, blk].astype(dtype)  # (W, bs, K, D)
    vb = v_pool[layer, blk].astype(dtype)
    logits = jnp.einsum("wqkgd,wtkd->wqkgt", q[seq], kb, preferred_element_type=jnp.float32)
    key_pos = j[:, None] * bs + jnp.arange(bs)  # (W, bs)
    visible = (key_pos[:, None, :] <= positions[seq][:, :, None]) & live[:, None, None]  # (W, Q, bs)
    logits = jnp.where(visible[:, :, None, None, :], logits, -jnp.inf)
    mi = jnp.max(logits, axis=-1)  # (W, Q, K, G); -inf where the item shows a row nothing
    p = jnp.exp(logits - jnp.where(jnp.isfinite(mi), mi, 0.0)[..., None])
    li = jnp.sum(p, axis=-1)
    ai = jnp.einsum("wqkgt,wtkd->wqkgd", p.astype(dtype), vb, preferred_element_type=jnp.float32)
    sid = jnp.where(live, seq, s)  # items past the end go to no sequence (dropped by the segment ops)
    m_new = jnp.maximum(m, jax.ops.segment_max(mi, sid, num_segments=s, indices_are_sorted=True))
    base = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    old = jnp.exp(m - base)
    mine = jnp.exp(mi - base[seq])
    l = l * old + jax.ops.segment_sum(li * mine, sid, num_segments=s, indices_are_sorted=True)
    acc = acc * old[..., None] + jax.ops.segment_sum(ai * mine[..., None], sid, num_segments=s,
                                                     indices_are_sorted=True)
    return m_new, l, acc

  init = (jnp.full((s, nq, n_kv, g), -jnp.inf, jnp.float32), jnp.zeros((s, nq, n_kv, g), jnp.float32),
          jnp.zeros((s, nq, n_kv, g, d), jnp.float32))
  _, l, acc = jax.lax.fori_loop(0, (total + work - 1) // work, chunk, init)
  return jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)


def gathered_attention(q, k_pool, v_pool, layer, positions, block_tables, n_blocks, n_read: int, dtype):
  """:func:`paged_attention` for sequences whose rows all lie in their first ``n_read`` blocks: each sequence's
  first ``n_read`` table blocks are gathered into one contiguous row of keys and one softmax runs over it
  (positions past a row's own, and every position of a sequence with ``n_blocks == 0``, masked).

  One gather and two batched matmuls per layer instead of a loop over work items with per-sequence merges:
  at short extents (a few blocks per sequence) the loop's fixed cost per iteration outweighs the positions
  it saves. Same arguments as :func:`paged_attention` (``n_read`` static, at most the table's width; a row
  at a position past ``n_read`` blocks is not supported). Returns (S, Q, K, G, D) float32."""
  s, nq, n_kv, g, d = q.shape
  n_pool, bs = k_pool.shape[1:3]
  blk = jnp.minimum(block_tables[:, :n_read], n_pool - 1)  # unused entries (n_pool) read a masked block
  kb = k_pool[layer, blk].astype(dtype).reshape(s, n_read * bs, n_kv, d)
  vb = v_pool[layer, blk].astype(dtype).reshape(s, n_read * bs, n_kv, d)
  logits = jnp.einsum("sqkgd,stkd->sqkgt", q, kb, preferred_element_type=jnp.float32)
  visible = ((jnp.arange(n_read * bs) <= positions[:, :, None])  # (S, Q, T)
             & (jnp.arange(n_read * bs) < n_blocks[:, None, None] * bs))
  logits = jnp.where(visible[:, :, None, None, :], logits, -jnp.inf)
  m = jnp.max(logits, axis=-1)
  p = jnp.exp(logits - jnp.where(jnp.isfinite(m), m, 0.0)[..., None])
  l = jnp.sum(p, axis=-1)
  acc = jnp.einsum("sqkgt,stkd->sqkgd", p.astype(dtype), vb, preferred_element_type=jnp.float32)
  return jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)


def paged_forward(params, k_pool, v_pool, tokens, positions, valid, block_tables, n_blocks, *, eps: float,
                  rope_max_timescale: float, rope_min_timescale: float = 1.0, dtype=jnp.float32,
                  work: int = 8, n_read: int = 0):
  """S sequences x Q new tokens each through every layer, keys and values written into their blocks.

  Args:
    tokens, positions, valid: (S, Q) int32 / int32 / bool; an invalid row writes nothing (output garbage).
    block_tables: (S, B) int32; n_blocks: (S,) blocks each sequence's rows read (covering every valid row).
    work: (sequence, block) pairs per iteration of :func:`paged_attention`.
    n_read: when > 0, attention is :func:`gathered_attention` over each sequence's first ``n_read`` blocks
      (every row must lie in them) instead of :func:`paged_attention`.
  Returns:
    final-normed hidden (S, Q, E) in ``dtype`` and the pools.
  """
  s, nq = tokens.shape
  n_pool, bs, n_kv, d = k_pool.shape[1:]
  pos = positions.reshape(-1)
  slot_blk = jnp.take_along_axis(block_tables, jnp.clip(positions // bs, 0, block_tables.shape[1] - 1), axis=1)
  blk = jnp.where(valid, slot_blk, n_pool).reshape(-1)  # n_pool: out of range, dropped
  off = pos % bs

  def attend(i, q, k, v, caches):
    kp, vp = caches
    kp = kp.at[i, blk, off].set(k.astype(kp.dtype), mode="drop")
    vp = vp.at[i, blk, off].set(v.astype(vp.dtype), mode="drop")
    qg = q.reshape(s, nq, n_kv, -1, d)  # query head h uses kv head h // G
    if n_read:
      o = gathered_attention(qg, kp, vp, i, positions, block_tables, n_blocks, n_read, dtype)
    else:
      o = paged_attention(qg, kp, vp, i, positions, block_tables, n_blocks, work, dtype)
    return o.reshape(s * nq, -1, d), (kp, vp)

  h, (k_pool, v_pool) = qwen3_layers(params, tokens.reshape(-1), pos, (k_pool, v_pool), attend, eps=eps,
                                     rope_max_timescale=rope_max_timescale,
                                     rope_min_timescale=rope_min_timescale, dtype=dtype)
  return h.reshape(s, nq, -1), k_pool, v_pool


# ----------------------------------------------------------------------------------------------- host


def block_hashes(tokens: Sequence[int], block_size: int, n_full: int, root: bytes) -> list[bytes]:
  """Chain hashes of the first ``n_full`` full blocks of ``tokens``: block j's hash covers every token of
  blocks 0..j and ``root`` (the weight version), so equal hashes mean equal prefixes."""
  out, h = [], root
  arr = np.asarray(tokens, np.int32)
  for j in range(n_full):
    h = hashlib.blake2b(h + arr[j * block_size:(j + 1) * block_size].tobytes(), digest_size=16).digest()
    out.append(h)
  return out


class PoolExhausted(RuntimeError):
  """No free or evictable block (the server's admission reserves blocks so that this never happens)."""


class BlockPool:
  """Host bookkeeping of the KV block pool: free blocks, reference counts, the prefix cache (chain hash ->
  block, evictable least recently used once nobody uses the block) and reservations.

  A block is in exactly one of: free, in use (refcount > 0), or cached and unused (evictable)."""

  def __init__(self, num_blocks: int, block_size: int, prefix_cache: bool = True):
    self.num_blocks, self.block_size, self.prefix_cache = int(num_blocks), int(block_size), bool(prefix_cache)
    self.free: collections.deque[int] = collections.deque(range(self.num_blocks))
    self.ref = np.zeros(self.num_blocks, np.int64)
    self.by_hash: dict[bytes, int] = {}
    self.hash_of: dict[int, bytes] = {}
    self.evictable: collections.OrderedDict[int, None] = collections.OrderedDict()  # LRU first
    self.reserved = 0  # blocks promised to admitted requests, not yet taken
    self.evictions = 0

  def available(self) -> int:
    """Blocks a new reservation may claim."""
    return len(self.free) + len(self.evictable) - self.reserved

  def lookup(self, hashes: Sequence[bytes]) -> list[int]:
    """The cached blocks of the longest prefix of ``hashes`` (not taken)."""
    out = []
    if self.prefix_cache:
      for h in hashes:
        b = self.by_hash.get(h)
        if b is None:
          break
        out.append(b)
    return out

  def take(self, block: int):
    """Use a cached block (refcount + 1; no longer evictable)."""
    if self.ref[block] == 0:
      self.evictable.pop(block)
    self.ref[block] += 1

  def allocate(self) -> int:
    """A block for new keys: a free one, else the least recently used cached one (its hash forgotten)."""
    if self.free:
      b = self.free.popleft()
    elif self.evictable:
      b, _ = self.evictable.popitem(last=False)
      del self.by_hash[self.hash_of.pop(b)]
      self.evictions += 1
    else:
      raise PoolExhausted(f"all {self.num_blocks} KV blocks are in use")
    self.ref[b] = 1
    return b

  def register(self, block: int, h: bytes):
    """Record that ``block`` (in use) holds the prefix ``h`` (first writer wins)."""
    if self.prefix_cache and h not in self.by_hash and block not in self.hash_of:
      self.by_hash[h] = block
      self.hash_of[block] = h

  def release(self, block: int):
    self.ref[block] -= 1
    if self.ref[block] < 0:
      raise AssertionError(f"KV block {block} released more often than taken")
    if self.ref[block] == 0:
      if block in self.hash_of:
        self.evictable[block] = None  # most recently used last
      else:
        self.free.append(block)

  def forget(self):
    """Drop every registration (a weight swap): unused cached blocks become free, blocks in use are freed
    when released."""
    for b in self.evictable:
      self.free.append(b)
    self.evictable.clear()
    self.by_hash.clear()
    self.hash_of.clear()

  def check_idle(self):
    """Raise unless every block is free or cached-and-unused and nothing is reserved (no leak)."""
    used = int(np.count_nonzero(self.ref))
    if used or self.reserved or len(self.free) + len(self.evictable) != self.num_blocks:
      raise AssertionError(f"KV pool not idle: {used} blocks in use, {self.reserved} reserved, "
                           f"{len(self.free)} free + {len(self.evictable)} cached of {self.num_blocks}")


@struct.dataclass
class ChunkResult:
  token: jax.Array  # (1,) int32 first generated token (meaningful after the last chunk)
  logprob: jax.Array  # (1,) float32


class PagedEngine(Engine):
  """The engine over a paged KV pool (module docstring). Prefill is :meth:`prefill_chunk`; decode is
  :meth:`generate_steps` with the block tables of every slot. :meth:`Engine.prefill` (MaxText's) stays
  available as the reference."""

  def __init__(self, mt_config, mesh, *, block_size: int, kv_blocks: int, prefill_chunk: int,
               logits_dtype="float32", prefill_buckets=(), attention_work: int = 0,
               gather_positions: int = 131072):
    super().__init__(mt_config, mesh, prefill_buckets, logits_dtype=logits_dtype, decode_impl="slot",
                     attention_block=block_size)
    self.decode_impl = "paged"
    self.block_size = int(block_size)
    self.kv_blocks = int(kv_blocks)
    self.chunk_size = int(prefill_chunk)
    self.table_width = -(-self.max_cache_length // self.block_size)
    # (sequence, block) pairs per attention iteration: decode reads about 2,048 positions (or a block per
    # slot) per iteration (measured on CPU, qwen3-tiny, 8 slots at 3,000 positions, 64-position blocks: 8 pairs
    # 751 tok/s, 32 pairs 1,154, 64 pairs 1,133, 128 pairs 1,088); a prefill chunk reads up to 8 blocks.
    self.decode_work = int(attention_work) or max(self.num_slots, 2048 // self.block_size)
    self.prefill_work = max(1, min(8, -(-self.chunk_size // self.block_size)))
    self.gather_positions = int(gather_positions)
    n_layers, _, _, n_kv, head_dim = self._slot_shape
    self._pool_shape = (n_layers, self.kv_blocks, self.block_size, n_kv, head_dim)
    self._chunk_jit = jax.jit(self._chunk_impl, donate_argnums=(1,),
                              out_shardings=(self._state_shardings, self._replicated))
    self._paged_steps_jit = jax.jit(self._paged_steps_impl, donate_argnums=(1,), static_argnums=(3, 4),
                                    out_shardings=(self._state_shardings, self._replicated))

  def chunk_bucket(self, n: int) -> int:
    """The compiled chunk length ``n`` prompt tokens are padded to: ``prefill_chunk`` halved while it still
    holds them (not below 16), so a short prompt or a reused prompt's new suffix is not padded to a whole
    chunk (one compile per halving)."""
    size = self.chunk_size
    while size // 2 >= max(n, 16) and size % 2 == 0:
      size //= 2
    return size

  @property
  def kv_bytes(self) -> int:
    """Bytes of the K and V pools."""
    return 2 * math.prod(self._pool_shape) * self._dtype.itemsize

  def token_limit(self, prompt_len: int) -> int:
    return self.max_cache_length - prompt_len + 1

  def init_decode_state(self) -> DecodeState:
    s = self.num_slots
    state = DecodeState(
        cache={"k": jnp.zeros(self._pool_shape, self._dtype), "v": jnp.zeros(self._pool_shape, self._dtype)},
        tokens=jnp.zeros((s,), jnp.int32), next_pos=jnp.zeros((s,), jnp.int32),
        n_generated=jnp.zeros((s,), jnp.int32), keys=jax.random.split(jax.random.key(0), s),
        temperature=jnp.ones((s,), jnp.float32), top_k=jnp.zeros((s,), jnp.int32),
        top_p=jnp.ones((s,), jnp.float32), active=jnp.zeros((s,), bool))
    return jax.device_put(state, self._state_shardings)

  def prefill_chunk(self, params, state: DecodeState, tokens: Sequence[int], start: int, table, slot: int,
                    key: jax.Array, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                    last: bool = False) -> tuple[DecodeState, ChunkResult]:
    """Write ``tokens`` (at most ``prefill_chunk``) at positions ``start..`` of the sequence whose block table
    is ``table`` (B,) (blocks for those positions must be in it). With ``last`` the chunk ends the prompt: its
    final token's logits sample the first generated token (with ``token_key(key, 0)``) and ``slot`` becomes
    active at position ``start + len(tokens)`` (donates ``state``)."""
    n = len(tokens)
    if not 0 < n <= self.chunk_size:
      raise ValueError(f"a prefill chunk holds 1..{self.chunk_size} tokens, got {n}")
    padded = np.zeros((self.chunk_bucket(n),), np.int32)
    padded[:n] = np.asarray(tokens, np.int32)
    return self._chunk_jit(params, state, jnp.asarray(padded), jnp.int32(start), jnp.int32(n),
                           jnp.asarray(table, jnp.int32), jnp.int32(slot), key,
                           jnp.float32(temperature), jnp.int32(top_k), jnp.float32(top_p), jnp.bool_(last))

  def generate_steps(self, params, state: DecodeState, num_steps: int, tables=None, read_blocks=None):
    """``num_steps`` decode steps for every active slot with block tables ``tables`` (S, B) (donates
    ``state``): blocks for every position written must be in them (entries past are dropped writes).
    ``read_blocks`` (S,): how many blocks each slot's rows read in this call at most (every position the call
    writes lies in them; 0 for an inactive slot), from which :meth:`attention_plan` chooses the attention
    path; None: any position of the table."""
    if tables is None:
      raise ValueError("paged decode needs the slots' block tables")
    return self._paged_steps_jit(params, state, jnp.asarray(tables, jnp.int32), int(num_steps),
                                 self.attention_plan(read_blocks))

  def attention_plan(self, read_blocks=None) -> int:
    """The decode attention for a call whose slots read ``read_blocks`` (S,) blocks (None: the whole table):
    the number of blocks per slot :func:`gathered_attention` gathers (the largest count rounded up to a power
    of two, so a growing batch compiles a few shapes, at most the table's width), or 0 for the split-K
    :func:`paged_attention`.

    Gathering is chosen when it reads at most 3x the blocks in use (it pays for every slot's ``n_read``
    blocks; the split-K loop only for each slot's own, at about 3x the cost per position: measured on CPU,
    qwen3-tiny, 2 layers, 8 slots at 107..320 positions 308 vs 724 us, 64 slots at 682..2048 positions 7.2
    vs 20.8 ms, 64 slots with one at 2,048 and the rest at 300 positions 9.6 vs 7.1 ms) and at most
    ``gather_positions`` positions in all (the gathered keys and values are a temporary of that size per
    layer)."""
    s, width = self.num_slots, self.table_width
    if read_blocks is None:
      n_read, used = width, s * width
    else:
      blocks = np.minimum(np.asarray(read_blocks, np.int64), width)
      n_read = min(width, 1 << max(0, int(blocks.max(initial=0)) - 1).bit_length())
      used = int(blocks.sum())
    if s * n_read * self.block_size <= self.gather_positions and s * n_read <= 3 * max(used, 1):
      return n_read
    return 0

  def prefill_prompt(self, params, state: DecodeState, prompt: Sequence[int], table, slot: int, key: jax.Array,
                     start: int = 0, **sampling) -> tuple[DecodeState, ChunkResult]:
    """``prompt[start:]`` chunk by chunk (positions ``start..``; earlier ones already in the table's blocks),
    the last chunk activating ``slot`` (:meth:`prefill_chunk`)."""
    n = len(prompt)
    for a in range(start, n, self.chunk_size):
      b = min(n, a + self.chunk_size)
      state, res = self.prefill_chunk(params, state, prompt[a:b], a, table, slot, key, last=b == n, **sampling)
    return state, res

  def insert(self, prefix, state, slot):
    raise NotImplementedError("the paged engine writes prompts into its pool with prefill_chunk(..., last=True) "
                              "(prefill() is MaxText's whole-prompt reference and its cache has no pool layout)")

  def generate(self, params, state, tables=None):
    state, res = self.generate_steps(params, state, 1, tables)
    return state, jax.tree.map(lambda x: x[0], res)

  def _forward(self, params, state, tokens, positions, valid, tables, n_blocks, work, n_read=0):
    mt = self.config
    return paged_forward(params, state.cache["k"], state.cache["v"], tokens, positions, valid, tables, n_blocks,
                         eps=float(mt.normalization_layer_epsilon), rope_max_timescale=float(mt.rope_max_timescale),
                         rope_min_timescale=float(mt.rope_min_timescale), dtype=self._dtype, work=work,
                         n_read=n_read)

  def _chunk_impl(self, params, state, tokens, start, n, table, slot, key, temperature, top_k, top_p, last):
    c = tokens.shape[0]
    positions = start + jnp.arange(c, dtype=jnp.int32)
    valid = jnp.arange(c) < n
    n_blocks = (start + n - 1) // self.block_size + 1
    h, kp, vp = self._forward(params, state, tokens[None], positions[None], valid[None], table[None],
                              n_blocks[None], self.prefill_work)
    cache = jax.lax.with_sharding_constraint({"k": kp, "v": vp}, self._cache_shardings)
    final = jax.lax.dynamic_index_in_dim(h[0], n - 1, axis=0, keepdims=True)  # (1, E)
    logits = jax.lax.with_sharding_constraint(self._logits(params, final), self._replicated)
    tok, lp = sample_tokens(logits, token_key(key, jnp.int32(0))[None], temperature[None], top_k[None],
                            top_p[None])
    at = jnp.where(last, slot, self.num_slots)  # out of range (dropped) unless the prompt ends here
    put = lambda full, x: full.at[at].set(x, mode="drop")
    new = DecodeState(
        cache=cache, tokens=put(state.tokens, tok[0]), next_pos=put(state.next_pos, start + n),
        n_generated=put(state.n_generated, jnp.int32(1)), keys=put(state.keys, key),
        temperature=put(state.temperature, temperature), top_k=put(state.top_k, top_k),
        top_p=put(state.top_p, top_p), active=put(state.active, jnp.bool_(True)))
    return new, ChunkResult(token=tok, logprob=lp)

  def _paged_steps_impl(self, params, state, tables, num_steps, n_read):
    def step(st, _):
      act = st.active
      n_blocks = jnp.where(act, st.next_pos // self.block_size + 1, 0)
      h, kp, vp = self._forward(params, st, st.tokens[:, None], st.next_pos[:, None], act[:, None], tables,
                                n_blocks, self.decode_work, n_read)
      cache = jax.lax.with_sharding_constraint({"k": kp, "v": vp}, self._cache_shardings)
      logits = jax.lax.with_sharding_constraint(self._logits(params, h[:, 0]), self._replicated)
      keys = jax.vmap(token_key)(st.keys, st.n_generated)
      tok, lp = sample_tokens(logits, keys, st.temperature, st.top_k, st.top_p)
      new = st.replace(cache=cache, tokens=jnp.where(act, tok, st.tokens),
                       next_pos=st.next_pos + act.astype(jnp.int32),
                       n_generated=st.n_generated + act.astype(jnp.int32))
      return new, StepResult(tokens=tok, logprobs=lp, active=act)

    return jax.lax.scan(step, state, None, length=num_steps)
