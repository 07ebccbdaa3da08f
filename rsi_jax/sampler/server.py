"""Continuous batching over the :class:`~rsi_jax.sampler.engine.Engine`: the sampler the harness talks to.

One background thread owns the decode state. Each turn of its loop it

1. applies a pending weight swap when the swap policy allows it,
2. admits queued requests into free slots (prefill -> insert, without waiting for the prefill's token),
3. dispatches ``decode_steps`` decode steps for all slots (one call), and while the device computes them,
   records the previous call's tokens on the host, finishes requests (EOS, stop ids, stop strings, max new
   tokens, full cache) and frees their slots.

So requests of different lengths and arrival times share decode steps, and a slot is refilled as soon as
its request ends. Any number of threads may call :meth:`SamplerServer.submit` / :meth:`generate`
(:class:`rsi_jax.policy.AsyncPolicy`). Host bookkeeping trails the device by one call, so a finished slot
runs up to ``2 * decode_steps - 1`` extra (discarded) steps before it is refilled; more steps per call mean
fewer host round trips and dispatches per token.

Weight swap (:meth:`SamplerServer.update_weights`): the new actor params are resharded onto the sampling
mesh at once; the loop switches between steps. ``swap_policy="finish_on_old"``: admission pauses, requests
in flight finish on the old weights, then the switch happens (every completion comes from one version).
``"mark"``: the switch happens at the next step and requests in flight continue on the new weights;
their completions carry ``version_changed=True`` and the version that sampled their last token.

With a :class:`~rsi_jax.sampler.paged.PagedEngine`, admission, prefill and the KV blocks of each request go
through a :class:`~rsi_jax.sampler.paged_scheduler.PagedScheduler` (block tables, prefix reuse, chunked
prefill between decode calls). What one request carries, its prompt limit and stop strings, and the counters:
:mod:`rsi_jax.sampler.request`.
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Sequence
from concurrent.futures import Future

import jax
import numpy as np

from rsi_jax import policy as P
from rsi_jax.config import Config
from rsi_jax.sampler.engine import Engine
from rsi_jax.sampler.factory import build_engine
from rsi_jax.sampler.paged import BlockPool, PagedEngine
from rsi_jax.sampler.paged_scheduler import PagedScheduler
from rsi_jax.sampler.request import Request, ServerStats, prompt_limit, resolve, stop_string_hit

QWEN3_EOS_IDS = (151645, 151643)  # <|im_end|>, <|endoftext|>


class SamplerServer:
  """A thread-safe :class:`rsi_jax.policy.AsyncPolicy` with continuous batching over one engine.

  Args:
    engine: the decode engine.
    params: actor params (any mesh; resharded onto the sampling mesh).
    tokenizer: anything with ``decode(ids) -> str`` (needed only for stop strings), e.g.
      :func:`rsi_jax.models.tokenizer.load_tokenizer`; its ``eos_ids``, when present, are the default
      end-of-sequence ids.
    eos_token_ids: ids that end a completion (finish "eos"), in addition to each request's stop ids.
    swap_policy: "finish_on_old" or "mark" (module docstring).
    prompt_overflow: what a prompt longer than the limit (:attr:`prompt_limit`) gets: "reject" (a completion
      with finish "prompt_too_long" and no tokens), "error" (``submit`` raises ValueError) or
      "truncate_left" (the most recent ``prompt_limit`` tokens are kept; ``prompt_len`` tells).
    weight_version: version tag of ``params``.
    seed: the stream requests without a seed draw their keys from.
    decode_steps: decode steps per engine call (``sampler.decode_steps``); outputs do not depend on it.
    max_input_tokens: longest prompt accepted (``rollout.max_input_tokens``); also bounded by the engine:
      ``max_prefill_length`` (slot / maxtext) or ``max_cache_length - 1`` (paged, chunked prefill).
    prefix_cache: paged engine: reuse cached prefix blocks (``sampler.prefix_cache``).

  With a :class:`~rsi_jax.sampler.paged.PagedEngine` a request is admitted when a slot is free *and* the KV
  pool can reserve the blocks of its prompt plus ``max_new_tokens`` (otherwise it waits in the queue); its
  prompt is prefilled in chunks between decode calls, starting after the longest cached prefix, at most one
  chunk per request and one chunk's worth of tokens per loop turn
  (:class:`~rsi_jax.sampler.paged_scheduler.PagedScheduler`).
  """

  def __init__(self, engine: Engine, params, *, tokenizer=None, eos_token_ids: Sequence[int] | None = None,
               swap_policy: str = "finish_on_old", prompt_overflow: str = "reject", weight_version: int = 0,
               seed: int = 0, decode_steps: int = 1, max_input_tokens: int | None = None,
               prefix_cache: bool = True):
    if swap_policy not in ("finish_on_old", "mark"):
      raise ValueError(f"swap_policy must be 'finish_on_old' or 'mark', got {swap_policy!r}")
    if prompt_overflow not in ("reject", "error", "truncate_left"):
      raise ValueError(f"prompt_overflow must be reject/error/truncate_left, got {prompt_overflow!r}")
    if decode_steps < 1:
      raise ValueError(f"decode_steps must be >= 1, got {decode_steps}")
    self.engine = engine
    self.decode_steps = int(decode_steps)
    self.tokenizer = tokenizer
    if eos_token_ids is None:
      eos_token_ids = getattr(tokenizer, "eos_ids", QWEN3_EOS_IDS)
    self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
    self.swap_policy = swap_policy
    self.prompt_overflow = prompt_overflow
    self.vocab_size = int(engine.config.vocab_size)
    self.stats = ServerStats()
    paged = isinstance(engine, PagedEngine)
    self.prompt_limit = prompt_limit(paged, engine.max_cache_length, engine.max_prefill_length,
                                     max_input_tokens)
    # The paged engine's KV bookkeeping; None on the slot / maxtext engines.
    self._paged = (PagedScheduler(engine, prefix_cache=prefix_cache, decode_steps=self.decode_steps,
                                  version=weight_version, stats=self.stats) if paged else None)
    self._params = engine.load_params(params)
    self._version = weight_version
    self._pending_swap = None  # (params, version) waiting to be applied
    self._seed_key = jax.random.key(seed)
    self._counter = itertools.count()
    self._queue: collections.deque[Request] = collections.deque()
    self._cv = threading.Condition()
    self._closed = False
    self._error: BaseException | None = None
    self._slots: list[Request | None] = [None] * engine.num_slots
    self._cancelled_slots: list[int] = []  # freed by the loop thread (it owns the decode state)
    self._state = engine.init_decode_state()
    self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)
    self._thread.start()

  @classmethod
  def from_config(cls, cfg: Config, params, *, tokenizer=None, devices=None, **kw) -> "SamplerServer":
    """The server the ``sampler`` section describes; the tokenizer defaults to ``model.tokenizer_path``'s."""
    if tokenizer is None:
      from rsi_jax.models.tokenizer import load_tokenizer
      tokenizer = load_tokenizer(cfg.model.tokenizer_path)
    s = cfg.sampler
    kw.setdefault("swap_policy", s.swap_policy)
    kw.setdefault("prompt_overflow", s.prompt_overflow)
    kw.setdefault("seed", cfg.run.seed)
    kw.setdefault("decode_steps", s.decode_steps)
    kw.setdefault("max_input_tokens", cfg.rollout.max_input_tokens)
    kw.setdefault("prefix_cache", s.prefix_cache)
    return cls(build_engine(cfg, devices), params, tokenizer=tokenizer, **kw)

  # ------------------------------------------------------------------------------------------ public

  @property
  def weight_version(self) -> int:
    return self._version

  @property
  def pool(self) -> BlockPool | None:
    """The paged engine's KV block pool (None on the other engines)."""
    return None if self._paged is None else self._paged.pool

  @property
  def max_prompt_tokens(self) -> int | None:
    """Longest prompt served whole (None with ``truncate_left``, which serves any length by cutting it)."""
    return None if self.prompt_overflow == "truncate_left" else self.prompt_limit

  def submit(self, prompt_ids: Sequence[int], params: P.SamplingParams) -> Future:
    """Queue one request; the future resolves to a :class:`~rsi_jax.policy.Completion`. Abort it with
    :meth:`cancel` (which frees its slot); a bare ``future.cancel()`` leaves the request running to its end."""
    prompt = np.asarray(prompt_ids, dtype=np.int64).reshape(-1)
    if prompt.size == 0:
      raise ValueError("empty prompt")
    if prompt.min() < 0 or prompt.max() >= self.vocab_size:
      raise ValueError(f"prompt ids must be in [0, {self.vocab_size}), got min {prompt.min()} max {prompt.max()}")
    if params.stop_strings and self.tokenizer is None:
      raise ValueError("stop_strings need a tokenizer (SamplerServer(tokenizer=...))")
    fut: Future = Future()
    limit = self.prompt_limit
    if prompt.size > limit:
      if self.prompt_overflow == "error":
        what = ("the limit (rollout.max_input_tokens / sampler.max_cache_length - 1)" if self._paged is not None
                else "sampler.max_prefill_length")
        raise ValueError(f"prompt of {prompt.size} tokens exceeds {what}={limit}")
      if self.prompt_overflow == "reject":
        fut.set_result(P.Completion(np.zeros(0, np.int32), np.zeros(0, np.float32), P.FINISH_REJECTED,
                                    self._version, prompt_len=int(prompt.size)))
        return fut
      prompt = prompt[-limit:]
    key = (jax.random.key(params.seed) if params.seed is not None
           else jax.random.fold_in(self._seed_key, next(self._counter)))
    req = Request(prompt=prompt.astype(np.int32), params=params, key=key, future=fut,
                   stop_ids=frozenset(params.stop_token_ids) | self.eos_token_ids)
    with self._cv:
      if self._closed:
        raise RuntimeError("sampler is closed") from self._error
      self._queue.append(req)
      self._cv.notify()
    return fut

  def generate(self, prompt_ids: Sequence[int], params: P.SamplingParams) -> P.Completion:
    """Blocking :meth:`submit` (the :class:`~rsi_jax.policy.Policy` call)."""
    return self.submit(prompt_ids, params).result()

  def update_weights(self, params, version: int | None = None) -> int:
    """Hot-swap to new actor params (resharded from their mesh now, switched between decode steps).

    Returns the new version (default: current + 1). Requests in flight are never dropped."""
    new = self.engine.load_params(params)
    with self._cv:
      base = self._pending_swap[1] if self._pending_swap is not None else self._version
      version = base + 1 if version is None else int(version)
      self._pending_swap = (new, version)
      self._cv.notify()
    return version

  def cancel(self, future: Future) -> bool:
    """Abort the request behind ``future`` (an aborted episode): a queued request is dropped, a running one
    loses its slot at the next step. The future fails with :class:`concurrent.futures.CancelledError`.
    Returns False if the request had already finished (or was cancelled before).

    Finishing and cancelling both decide under the lock (the request's ``done`` flag), so exactly one of
    them ends the future, even when the cancel lands while the request's last token is being recorded."""
    with self._cv:
      req = next((r for r in self._queue if r.future is future), None)
      if req is not None:
        self._queue.remove(req)
      else:
        slot = next((i for i, r in enumerate(self._slots) if r is not None and r.future is future), None)
        if slot is None or self._slots[slot].done:
          return False
        req = self._slots[slot]
        self._cancelled_slots.append(slot)  # the loop thread frees it (it owns the decode state)
        self._cv.notify()
      req.done = True
      self.stats.cancelled += 1
    future.cancel()  # outside the lock: the future's callbacks run here
    future.set_running_or_notify_cancel()  # wakes wait() / as_completed() callers (as an executor does)
    return True

  def wait_swapped(self, timeout: float | None = None) -> bool:
    """Block until no swap is pending (for tests and the pipeline's version bookkeeping)."""
    with self._cv:
      return self._cv.wait_for(lambda: self._pending_swap is None or self._closed, timeout)

  def close(self):
    """Stop the loop; queued and in-flight requests fail with RuntimeError."""
    with self._cv:
      self._closed = True
      self._cv.notify_all()
    self._thread.join()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  # ------------------------------------------------------------------------------------------ loop

  def _loop(self):
    # (StepResult on device, request per slot at dispatch, weight version at dispatch, admissions whose first
    # token is still on device)
    pending = None
    try:
      while True:
        with self._cv:
          while not self._closed and not self._queue and pending is None and not self._busy() \
              and self._pending_swap is None:
            self._cv.wait()
          if self._closed:
            break
          for slot in self._cancelled_slots:  # cancelled requests give their slots back
            req = self._slots[slot]
            if req is not None and req.done:
              self._release_slot(slot, req, finished=False)
          self._cancelled_slots.clear()
          self._maybe_swap()
          admit = []
          while self._queue and self._pending_swap is None and None in self._slots:
            slot = self._slots.index(None)
            req = self._queue[0]
            if self._paged is not None and not self._paged.admit(slot, req):
              break  # the KV pool is full: the request waits (in order) until blocks are released
            self._queue.popleft()
            req.start_version = req.version = self._version
            self._slots[slot] = req
            admit.append((slot, req))
        if self._paged is not None:  # admitted requests were queued for chunked prefill
          self._state, admitted = self._paged.prefill_step(self._params, self._state)
        else:
          admitted = [self._prefill_into(slot, req) for slot, req in admit]
        snapshot = [r if r is not None and (self._paged is None or self._paged.decoding(r)) else None
                    for r in self._slots]
        if any(r is not None for r in snapshot):
          if self._paged is not None:
            tables = self._paged.decode_tables(snapshot)
            self._state, result = self.engine.generate_steps(self._params, self._state, self.decode_steps,
                                                             tables, self._paged.read_blocks)
          else:
            self._state, result = self.engine.generate_steps(self._params, self._state, self.decode_steps)
          self.stats.decode_steps += self.decode_steps
          if self._paged is not None and self._paged.prefilling:
            self.stats.interleaved_steps += self.decode_steps
          self.stats.busy_slot_steps += self.decode_steps * sum(r is not None for r in snapshot)
          if pending is not None:
            self._record(*pending)  # host work overlaps the call just dispatched
          pending = (result, snapshot, self._version, admitted)
        elif pending is not None:
          self._record(*pending)
          pending = None
    except BaseException as e:  # noqa: BLE001 - every waiting caller must learn of the failure
      self._error = e
    with self._cv:
      self._closed = True
      err = self._error or RuntimeError("sampler closed")
      ended = [r for r in list(self._queue) + [r for r in self._slots if r is not None] if not r.done]
      for req in ended:
        req.done = True  # a cancel() from now on finds them done
      self._queue.clear()
      self._cv.notify_all()
    for req in ended:
      resolve(req.future, error=RuntimeError(f"sampler stopped: {err!r}"))

  def _busy(self) -> bool:
    return any(r is not None for r in self._slots)

  def _maybe_swap(self):
    """Apply a pending swap if the policy allows it now (called with the lock held).

    A step still being recorded belongs to requests that are done once every slot is free, so an empty
    decode batch is a safe point for "finish_on_old"."""
    if self._pending_swap is None:
      return
    if self.swap_policy == "finish_on_old" and self._busy():
      return  # admission is paused until the slots drain
    self._params, self._version = self._pending_swap
    self._pending_swap = None
    self.stats.swaps += 1
    if self._paged is not None:
      self._paged.swap(self._version)  # cached keys were computed by the old weights
    self._cv.notify_all()

  def _prefill_into(self, slot: int, req: Request):
    """Prefill and insert without reading the first token back (that would wait for the decode call in
    flight); it is recorded with the next call's tokens. A request that ends on its first token therefore
    holds its slot for one call."""
    sp = req.params
    prefix = self.engine.prefill(self._params, req.prompt, req.key, temperature=sp.temperature,
                                 top_k=sp.top_k, top_p=sp.top_p)
    self.stats.prefills += 1
    self.stats.prefill_tokens += int(req.prompt.size)
    self._state = self.engine.insert(prefix, self._state, slot)
    return slot, req, prefix.token, prefix.logprob

  def _release_slot(self, slot: int, req: Request, finished: bool):
    """Free the slot; on the paged engine give its blocks back (:meth:`PagedScheduler.release`)."""
    self._state = self.engine.free(self._state, slot)
    if self._slots[slot] is req:
      self._slots[slot] = None
    if self._paged is not None:
      self._paged.release(slot, req, finished)

  def _record(self, result, snapshot, version, admitted=()):
    """Host side of one engine call ((steps, S) results): ``snapshot`` (request per slot), ``version`` as at
    dispatch, and the first tokens of the requests admitted just before it. A request's tokens after the one
    that finished it are discarded."""
    tokens, logprobs, first = jax.device_get((result.tokens, result.logprobs,
                                              [(tok, lp) for _, _, tok, lp in admitted]))
    # ``req.done`` is read without the lock here: a request seen running may still be cancelled before its
    # end is recorded, which _append settles under the lock.
    for (slot, req, _, _), (tok, lp) in zip(admitted, first):
      if not req.done:  # (done: cancelled before its first token was read)
        self._append(slot, req, int(tok[0]), float(lp[0]))
    for slot, req in enumerate(snapshot):
      if req is None or req.done:
        continue
      req.version = version
      for step in range(tokens.shape[0]):
        if self._append(slot, req, int(tokens[step, slot]), float(logprobs[step, slot])):
          break

  def _append(self, slot: int, req: Request, token: int, logprob: float) -> bool:
    """Record one sampled token; if the request ended, complete its future and free its slot, unless a
    :meth:`cancel` got there first (then the cancel path frees the slot, once). Returns whether the request
    is over (ended here or cancelled)."""
    req.tokens.append(token)
    req.logprobs.append(logprob)
    sp = req.params
    n = len(req.tokens)
    reason = None
    if token in req.stop_ids:
      reason = P.FINISH_EOS
    elif sp.stop_strings and stop_string_hit(self.tokenizer, req.tokens, sp.stop_strings):
      reason = P.FINISH_STOP
    elif n >= sp.max_new_tokens:
      reason = P.FINISH_LENGTH
    elif n >= self.engine.token_limit(req.prompt.size):
      reason = P.FINISH_CACHE  # the slot's cache has no room for the next step
    if reason is None:
      return req.done  # a cancel seen here only saves recording the rest of the call's tokens
    with self._cv:  # the finish decision, atomic with cancel()'s
      if req.done:
        return True  # cancelled: the loop frees the slot at its next turn (_cancelled_slots)
      req.done = True
    self.stats.tokens += n
    self._release_slot(slot, req, finished=True)  # before the future's callbacks run (in this thread)
    resolve(req.future, P.Completion(
        token_ids=np.asarray(req.tokens, np.int32), logprobs=np.asarray(req.logprobs, np.float32),
        finish_reason=reason, weight_version=req.version, prompt_len=int(req.prompt.size),
        version_changed=req.version != req.start_version))
    return True
