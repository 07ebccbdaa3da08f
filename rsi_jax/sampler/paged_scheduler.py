"""The paged engine's side of the serving loop: block tables, admission by KV reservation, chunked prefill.

:class:`~rsi_jax.sampler.server.SamplerServer` keeps the request queue, the slots, cancellation and weight
swaps; with a :class:`~rsi_jax.sampler.paged.PagedEngine` it hands the KV bookkeeping of its requests to one
:class:`PagedScheduler`, which the loop thread alone calls:

* :meth:`~PagedScheduler.admit`: a request is admitted when a slot is free *and* the KV pool can reserve the
  blocks of its prompt plus ``max_new_tokens`` beyond its longest cached prefix (otherwise it waits in the
  queue); blocks are then taken from the reservation as the sequence grows.
* :meth:`~PagedScheduler.prefill_step`: prompt chunks between decode calls, oldest admission first, starting
  after the cached prefix, at most one chunk per request and one chunk's worth of tokens per loop turn (so
  several short prompts start decoding together); the last chunk samples the first token and starts
  decoding.
* :meth:`~PagedScheduler.decode_tables`: blocks for every position the next decode call writes, the (device)
  block tables and how many blocks each slot reads (``read_blocks``).
* :meth:`~PagedScheduler.release`: a request's blocks go back to the pool (a finished one first registers its
  full blocks in the prefix cache); :meth:`~PagedScheduler.swap` forgets the cache when the weights change.
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import numpy as np

from rsi_jax.sampler.paged import BlockPool, PagedEngine, block_hashes


@dataclasses.dataclass
class KVSeq:
  """One request's KV state on the paged engine (``request.kv``)."""
  blocks: list = dataclasses.field(default_factory=list)  # KV pool block of each of its blocks, in order
  reserve: int = 0  # blocks reserved at admission and not yet taken
  cursor: int = 0  # next prompt position to prefill
  decode_pos: int = 0  # next position a decode step writes (once decoding)
  decoding: bool = False
  hashes: tuple = (None, [])  # (weight-version root, chain hashes of the prompt's full blocks)


class PagedScheduler:
  """KV bookkeeping of a server's requests on one paged engine.

  A request is any object with ``prompt`` ((n,) int32), ``params`` (:class:`~rsi_jax.policy.SamplingParams`),
  ``key``, ``tokens``, ``done``, ``start_version``, ``version`` and a ``kv`` attribute this scheduler owns
  (None until :meth:`admit` first sees it). ``stats`` is the server's
  :class:`~rsi_jax.sampler.request.ServerStats`; the prefill, reuse and KV counters are counted here.
  """

  def __init__(self, engine: PagedEngine, *, prefix_cache: bool, decode_steps: int, version: int, stats):
    self.engine = engine
    self.decode_steps = decode_steps
    self.version = version  # weights the cache's keys were computed with
    self.stats = stats
    self.pool = BlockPool(engine.kv_blocks, engine.block_size, prefix_cache)
    self.tables = np.full((engine.num_slots, engine.table_width), engine.kv_blocks, np.int32)
    self._tables_dev = None  # device copy of tables, None when stale
    self.read_blocks = np.zeros(engine.num_slots, np.int64)  # per slot, blocks the last decode call reads
    self.prefilling: collections.deque = collections.deque()  # (slot, request) in admission order

  def _root(self) -> bytes:
    return f"weights-v{self.version}".encode()

  def swap(self, version: int):
    """The weights changed: cached keys were computed by the old ones."""
    self.version = version
    self.pool.forget()

  def admit(self, slot: int, req) -> bool:
    """Take the request's longest cached prefix and reserve blocks for the rest of its prompt and
    ``max_new_tokens``; False (nothing taken) if the pool cannot hold them yet. An admitted request is queued
    for :meth:`prefill_step`."""
    if req.kv is None:
      req.kv = KVSeq()
    kv, pool, bs, n = req.kv, self.pool, self.engine.block_size, int(req.prompt.size)
    # Only blocks strictly before the last prompt token: that token is always computed (it samples the first
    # generated token).
    if kv.hashes[0] != self._root():  # once per request (again after a swap): it may wait many loop turns
      kv.hashes = (self._root(), block_hashes(req.prompt, bs, (n - 1) // bs, self._root()))
    cached = pool.lookup(kv.hashes[1])
    extent = min(n + req.params.max_new_tokens, self.engine.max_cache_length)
    need = -(-extent // bs) - len(cached)
    if need > pool.available() - sum(int(pool.ref[b] == 0) for b in cached):
      return False
    for b in cached:
      pool.take(b)
    pool.reserved += need
    kv.reserve, kv.blocks, kv.cursor = need, list(cached), len(cached) * bs
    self.tables[slot] = self.engine.kv_blocks
    self.tables[slot, :len(cached)] = cached
    self._tables_dev = None
    self.stats.reused_tokens += kv.cursor
    self.prefilling.append((slot, req))
    return True

  def decoding(self, req) -> bool:
    """Whether the request's prompt is prefilled (it takes part in decode calls)."""
    return req.kv.decoding

  def _grow(self, slot: int, kv: KVSeq, upto: int):
    """Give the sequence blocks for its positions < ``upto`` (from its reservation; positions past the
    reservation are never needed and their writes are dropped)."""
    bs = self.engine.block_size
    while len(kv.blocks) * bs < upto and kv.reserve > 0:
      b = self.pool.allocate()
      self.pool.reserved -= 1
      kv.reserve -= 1
      self.tables[slot, len(kv.blocks)] = b
      kv.blocks.append(b)
      self._tables_dev = None

  def _register(self, req, tokens, upto: int):
    """Enter the request's full blocks of positions < ``upto`` into the prefix cache (same weights only)."""
    if req.start_version != self.version or req.version != self.version:
      return
    for b, h in zip(req.kv.blocks, block_hashes(tokens, self.engine.block_size, upto // self.engine.block_size,
                                                self._root())):
      self.pool.register(b, h)

  def prefill_step(self, params, state):
    """Prefill chunks of the requests still prefilling, oldest admission first, at most one chunk per request
    and together at most ``prefill_chunk`` (compiled) tokens, so one loop turn computes no more than one full
    chunk: a long prompt advances one chunk per turn between decode calls, while short prompts admitted
    together (a burst of requests, or new turns whose prefix is cached) all start decoding at the next call
    instead of one call apart. Returns the new decode state and the first-token records
    ``(slot, request, token, logprob)`` of the requests whose prompts it completed."""
    budget, records, waiting = self.engine.chunk_size, [], collections.deque()
    for slot, req in self.prefilling:
      if req.done:  # cancelled while prefilling
        continue
      cost = self.engine.chunk_bucket(min(int(req.prompt.size) - req.kv.cursor, self.engine.chunk_size))
      if cost > budget and budget < self.engine.chunk_size:  # (a turn computes at least one chunk)
        budget = 0  # this turn is full: the rest wait, in admission order
        waiting.append((slot, req))
        continue
      budget -= cost
      state, rec = self._chunk(params, state, slot, req)
      if rec is None:  # a non-final chunk is a whole chunk: it fills the turn
        waiting.append((slot, req))
      else:
        records.append(rec)
    self.prefilling = waiting
    return state, records

  def _chunk(self, params, state, slot: int, req):
    """The request's next prompt chunk; its first-token record if the chunk ends the prompt, else None."""
    kv, sp, n = req.kv, req.params, int(req.prompt.size)
    start = kv.cursor
    end = min(n, start + self.engine.chunk_size)
    self._grow(slot, kv, end)
    last = end == n
    state, res = self.engine.prefill_chunk(
        params, state, req.prompt[start:end], start, self.tables[slot], slot, req.key,
        temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p, last=last)
    kv.cursor = end
    self.stats.prefill_chunks += 1
    self.stats.prefill_tokens += end - start
    if not last:
      return state, None
    self.stats.prefills += 1
    self._register(req, req.prompt, n)
    kv.decoding, kv.decode_pos = True, n
    return state, (slot, req, res.token, res.logprob)

  def decode_tables(self, snapshot):
    """Blocks for every position the next decode call writes (``snapshot``: the decoding request per slot,
    else None), then the (device) block tables. Also sets :attr:`read_blocks`, the blocks each slot's rows
    read in that call (the engine chooses its attention path by them)."""
    bs = self.engine.block_size
    self.read_blocks = np.zeros(self.engine.num_slots, np.int64)
    for slot, req in enumerate(snapshot):
      if req is not None:
        kv = req.kv
        self._grow(slot, kv, kv.decode_pos + self.decode_steps)
        self.stats.kv_live_positions += kv.decode_pos
        self.stats.kv_held_positions += len(kv.blocks) * bs
        kv.decode_pos += self.decode_steps
        self.read_blocks[slot] = -(-kv.decode_pos // bs)
    if self._tables_dev is None:
      self._tables_dev = jax.device_put(self.tables)
    return self._tables_dev

  def release(self, slot: int, req, finished: bool):
    """Give the request's blocks back; a finished one first enters the full blocks of its prompt and generated
    tokens into the prefix cache (every position but the last sampled token's holds its keys)."""
    kv = req.kv
    if finished and kv.decoding:
      self._register(req, np.concatenate([req.prompt, np.asarray(req.tokens, np.int32)]),
                     int(req.prompt.size) + len(req.tokens) - 1)
    for b in kv.blocks:
      self.pool.release(b)
    self.pool.reserved -= kv.reserve
    kv.blocks, kv.reserve, kv.decoding = [], 0, False
    self.tables[slot] = self.engine.kv_blocks
    self._tables_dev = None
