"""The policy protocol between the agent harness (``rsi_jax.env``) and the sampler (``rsi_jax.sampler``).

The harness renders a prompt to token ids, asks a :class:`Policy` for a completion, and records exactly what
came back: the sampled ids, their log-probabilities under the sampling model, why generation stopped, and the
weight version that produced them. Text is derived from ids, never the other way round (token-in, token-out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol, runtime_checkable

import numpy as np

# Why a completion ended.
FINISH_EOS = "eos"  # an end-of-sequence / end-of-turn token was sampled (it is included in token_ids)
FINISH_STOP = "stop"  # a stop string appeared in the decoded text (tokens up to and including it are kept)
FINISH_LENGTH = "length"  # max_new_tokens reached
FINISH_CACHE = "cache_full"  # the slot's KV cache (prompt + generated) is full
FINISH_REJECTED = "prompt_too_long"  # the prompt exceeded the maximum input length; nothing was generated
FINISH_REASONS = (FINISH_EOS, FINISH_STOP, FINISH_LENGTH, FINISH_CACHE, FINISH_REJECTED)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How to sample one completion. ``seed`` fixes the request's own RNG stream (None: engine-chosen)."""
  temperature: float = 1.0  # 0 = greedy
  top_p: float = 1.0
  top_k: int = 0  # 0 = off
  max_new_tokens: int = 256
  stop_token_ids: tuple[int, ...] = ()  # in addition to the engine's EOS ids
  stop_strings: tuple[str, ...] = ()
  seed: int | None = None

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0, got {self.top_k}")
    if self.max_new_tokens <= 0:
      raise ValueError(f"max_new_tokens must be > 0, got {self.max_new_tokens}")


@dataclasses.dataclass(frozen=True)
class Completion:
  """What the sampler produced for one prompt: the record a training sample is built from."""
  token_ids: np.ndarray  # (n,) int32 sampled ids, in order
  logprobs: np.ndarray  # (n,) float32 log-softmax of the raw logits at each sampled id
  finish_reason: str  # one of FINISH_REASONS
  weight_version: int  # version of the actor weights that sampled these tokens
  prompt_len: int = 0
  version_changed: bool = False  # True if a weight swap happened while this request was in flight ("mark")

  def __post_init__(self):
    if self.finish_reason not in FINISH_REASONS:
      raise ValueError(f"unknown finish_reason {self.finish_reason!r}")
    if len(self.token_ids) != len(self.logprobs):
      raise ValueError("token_ids and logprobs differ in length")


@runtime_checkable
class Policy(Protocol):
  """Prompt token ids + sampling parameters -> sampled ids, logprobs, finish reason, weight version.

  ``generate`` blocks and must be safe to call from many threads at once (one per environment episode);
  a batching implementation shares decode steps between the concurrent callers.
  """

  def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
    ...


@runtime_checkable
class AsyncPolicy(Policy, Protocol):
  """A Policy that also queues requests and returns futures resolving to :class:`Completion`."""

  def submit(self, prompt_ids: Sequence[int], params: SamplingParams) -> Future:
    ...
