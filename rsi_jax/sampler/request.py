"""The sampler server's request bookkeeping: the request record, its prompt and stop rules, its future, the counters.

:class:`~rsi_jax.sampler.server.SamplerServer` keeps the queue, the slots and the loop; what one request carries
and how it ends is here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError

import jax
import numpy as np

from rsi_jax import policy as P


@dataclasses.dataclass(eq=False)  # a request is itself: the queue removes it by identity
class Request:
  """One request of a :class:`~rsi_jax.sampler.server.SamplerServer`, from ``submit`` to its completion."""
  prompt: np.ndarray  # (n,) int32, after any truncation
  params: P.SamplingParams
  key: jax.Array  # typed PRNG key of this request
  future: Future
  stop_ids: frozenset
  start_version: int = 0  # weights that sampled the first token
  version: int = 0  # weights that sampled the latest token
  tokens: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  # Set exactly once, under the server's lock, by whoever ends the request: a completion, cancel() or the
  # close path. Only that one completes the future, so each future ends once.
  done: bool = False
  kv: object = None  # paged engine: its KV state, owned by the PagedScheduler (a paged_scheduler.KVSeq)


@dataclasses.dataclass
class ServerStats:
  """A server's counters (the paged scheduler counts prefill, reuse and KV positions)."""
  decode_steps: int = 0
  prefills: int = 0
  tokens: int = 0  # generated tokens delivered to requests
  busy_slot_steps: int = 0  # sum over decode steps of the number of occupied slots
  swaps: int = 0
  cancelled: int = 0
  prefill_tokens: int = 0  # prompt tokens computed (paged: excludes reused ones)
  reused_tokens: int = 0  # prompt tokens whose keys came from the prefix cache (paged)
  prefill_chunks: int = 0  # chunked prefill calls (paged)
  interleaved_steps: int = 0  # decode steps dispatched while a prompt was still being prefilled (paged)
  # paged, summed over decode calls: KV positions the decoding requests hold (whole blocks) and use
  kv_held_positions: int = 0
  kv_live_positions: int = 0


def resolve(future: Future, result=None, error: BaseException | None = None):
  """Complete the future of a request this thread has just marked done (so no
  :meth:`~rsi_jax.sampler.server.SamplerServer.cancel` can touch it). A future its owner cancelled directly
  (``future.cancel()``, not through the server) has nobody left to tell: it stays cancelled."""
  try:
    if error is not None:
      future.set_exception(error)
    else:
      future.set_result(result)
  except InvalidStateError:
    if not future.cancelled():
      raise


def prompt_limit(paged: bool, max_cache_length: int, max_prefill_length: int,
                 max_input_tokens: int | None = None) -> int:
  """Longest prompt a server serves whole: ``max_input_tokens`` (``rollout.max_input_tokens``), bounded by the
  engine (paged: ``max_cache_length - 1``, as chunked prefill takes any length that leaves room for one
  generated token; slot / maxtext: the whole-prompt prefill's ``max_prefill_length``)."""
  limit = max_cache_length - 1 if paged else max_prefill_length
  return min(limit, int(max_input_tokens)) if max_input_tokens else limit


def stop_string_hit(tokenizer, tokens: Sequence[int], stop_strings: Sequence[str]) -> bool:
  """Whether a stop string occurs in the decoded tail of ``tokens`` (checked after every new token).

  Only a tail window is decoded: a string of c characters spans at most c tokens (every token decodes to
  at least one character, up to a few partial UTF-8 bytes), so an occurrence that ended earlier was caught
  when it did."""
  width = max(len(s) for s in stop_strings) + 4
  text = tokenizer.decode(list(tokens[-width:]))
  return any(s in text for s in stop_strings)
