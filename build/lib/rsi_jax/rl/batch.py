"""Batch assembly: episodes' token records -> one padded (B, T) training batch (SPEC §2 layout).

Each linear segment of an episode is one row (summarization starts a new segment; segments of one rollout
share its id). The row holds exactly the ids the sampler saw and produced; ``gen_mask`` and ``turn_ids`` come
from the harness records, never from re-tokenized text.

Reward placement: the episode's terminal reward sits on the *last generated token of the rollout*, with
``done = 1`` there (the verifier ended the episode): that is the final segment's last generated token, or,
when the final segment generated nothing (its first call was rejected as too long), the last generated
token of the latest segment that did. Earlier segments end without ``done``; their last generated token
continues into the first generated token of the next segment through ``next_row`` (the pipeline hands that
row's TB-GAE carry across, Eq. 12, through segments without generated tokens), so summarization is not a
terminal event.
Episodes that ended in an infrastructure failure are masked out (``row_mask = 0``) and counted, never scored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class TrajectoryBatch(NamedTuple):
  """A padded batch of token rows. Every array is (B, T) unless noted."""
  tokens: np.ndarray  # int32
  positions: np.ndarray  # int32, 0.. within each row's real tokens
  segment_ids: np.ndarray  # int32: 1 on real tokens, 0 on padding (never attended to)
  gen_mask: np.ndarray  # float32: 1 on policy-generated tokens of rows that train
  turn_ids: np.ndarray  # int32
  rewards: np.ndarray  # float32: terminal reward on the last generated token of an episode's last segment
  dones: np.ndarray  # float32: 1 on that same token
  sampler_logprobs: np.ndarray  # float32: the sampler's logprobs (mismatch monitoring only)
  weight_versions: np.ndarray  # int32: weight version that sampled each generated token, -1 elsewhere
  row_mask: np.ndarray  # (B,) float32: 0 for padding rows and masked (infrastructure-failure) episodes
  next_row: np.ndarray  # (B,) int32: the row continuing this one (next segment), -1 if none


@dataclasses.dataclass(frozen=True)
class Sample:
  """One linear segment: ids with the harness's per-token records."""
  ids: np.ndarray  # (T,) int
  gen_mask: np.ndarray  # (T,) bool
  logprobs: np.ndarray  # (T,) float32 sampler logprobs on generated tokens
  turn_ids: np.ndarray  # (T,) int
  episode: int = 0  # index of the episode (rollout) it belongs to
  weight_versions: np.ndarray | None = None  # (T,) int: version that sampled each generated token (-1 else)


def episode_samples(segments: Sequence, episode: int) -> list[Sample]:
  """Samples from an episode's ``rsi_jax.env.harness.Segment`` records, in order."""
  return [Sample(np.asarray(s.ids), np.asarray(s.gen_mask, bool), np.asarray(s.logprobs, np.float32),
                 np.asarray(s.turn_ids), episode, np.asarray(s.weight_versions, np.int32)) for s in segments]


def assemble_batch(episodes: Sequence[Sequence[Sample]], rewards: Sequence[float],
                   train_mask: Sequence[bool] | None = None, *, pad_multiple: int = 1, pad_id: int = 0,
                   num_rows: int | None = None) -> TrajectoryBatch:
  """Pad the episodes' segments into one batch.

  Args:
    episodes: per episode, its segments in order (an episode with no generated token contributes rows that
      do not train).
    rewards: per episode, the terminal reward R (FDR / SPR of its verification outcome).
    train_mask: per episode, False to mask it out (infrastructure failure). Default: all train.
    pad_multiple: T is rounded up to a multiple of this (bounded set of compiled shapes).
    pad_id: the id written into padding (never attended to: segment id 0).
    num_rows: pad the batch to this many rows (e.g. a multiple of the mesh's batch shards).
  """
  if len(rewards) != len(episodes):
    raise ValueError(f"{len(episodes)} episodes but {len(rewards)} rewards")
  train_mask = [True] * len(episodes) if train_mask is None else list(train_mask)
  if len(train_mask) != len(episodes):
    raise ValueError(f"{len(episodes)} episodes but {len(train_mask)} train_mask entries")
  if pad_multiple <= 0:
    raise ValueError(f"pad_multiple must be > 0, got {pad_multiple}")
  rows: list[tuple[Sample, float, bool, bool]] = []  # sample, reward, holds the terminal token?, trains?
  nxt: list[int] = []
  for e, (segs, r, ok) in enumerate(zip(episodes, rewards, train_mask)):
    r = float(r)
    if ok and not np.isfinite(r):
      raise ValueError(f"episode {e}: reward {r} is not finite")
    for k, s in enumerate(segs):
      n = len(s.ids)
      if not (len(s.gen_mask) == len(s.logprobs) == len(s.turn_ids) == n) or (
          s.weight_versions is not None and len(s.weight_versions) != n):
        raise ValueError(f"episode {e} segment {k}: ids, gen_mask, logprobs, turn_ids and weight_versions "
                         f"differ in length")
    # the rollout's last generated token: in the last segment that generated anything
    term = max([k for k, s in enumerate(segs) if np.asarray(s.gen_mask).any()], default=-1)
    for k, s in enumerate(segs):
      last = k == len(segs) - 1
      rows.append((s, r, k == term, bool(ok)))
      nxt.append(len(rows) if not last else -1)
  b = len(rows) if num_rows is None else num_rows
  if b < len(rows):
    raise ValueError(f"num_rows={num_rows} is smaller than the {len(rows)} segments")
  t_max = max([len(s.ids) for s, *_ in rows] + [1])
  t = -(-t_max // pad_multiple) * pad_multiple

  tokens = np.full((b, t), pad_id, np.int32)
  positions = np.zeros((b, t), np.int32)
  segment_ids = np.zeros((b, t), np.int32)
  gen_mask = np.zeros((b, t), np.float32)
  turn_ids = np.zeros((b, t), np.int32)
  rew = np.zeros((b, t), np.float32)
  dones = np.zeros((b, t), np.float32)
  lps = np.zeros((b, t), np.float32)
  versions = np.full((b, t), -1, np.int32)
  row_mask = np.zeros((b,), np.float32)
  next_row = np.full((b,), -1, np.int32)
  for i, ((s, r, terminal, ok), nr) in enumerate(zip(rows, nxt)):
    n = len(s.ids)
    tokens[i, :n] = s.ids
    positions[i, :n] = np.arange(n)
    segment_ids[i, :n] = 1
    gen = s.gen_mask.astype(bool)
    turn_ids[i, :n] = s.turn_ids
    lps[i, :n] = np.where(gen, s.logprobs, 0.0)
    if s.weight_versions is not None:
      versions[i, :n] = np.where(gen, s.weight_versions, -1)
    next_row[i] = nr
    if not ok:
      continue  # masked: no generated tokens train, no reward is placed
    row_mask[i] = 1.0
    gen_mask[i, :n] = gen
    if terminal:
      j = int(np.flatnonzero(gen)[-1])
      rew[i, j] = r
      dones[i, j] = 1.0
  return TrajectoryBatch(tokens, positions, segment_ids, gen_mask, turn_ids, rew, dones, lps, versions,
                         row_mask, next_row)


def save_samples(path, episodes: Sequence[Sequence[Sample]]):
  """Episodes' samples to one ``.npz`` (local path or object-store URL), written atomically."""
  from etils import epath
  flat = [(e, s) for e, segs in enumerate(episodes) for s in segs]
  lens = np.asarray([len(s.ids) for _, s in flat], np.int64)

  def cat(f, dt, fill=None):
    parts = [np.asarray(getattr(s, f) if getattr(s, f) is not None else np.full(len(s.ids), fill), dt)
             for _, s in flat]
    return np.concatenate(parts) if parts else np.zeros(0, dt)
  tmp = epath.Path(str(path) + ".tmp")
  with tmp.open("wb") as f:
    np.savez(f, lengths=lens, episode=np.asarray([e for e, _ in flat], np.int64), ids=cat("ids", np.int32),
             gen_mask=cat("gen_mask", bool), logprobs=cat("logprobs", np.float32),
             turn_ids=cat("turn_ids", np.int32), weight_versions=cat("weight_versions", np.int32, -1))
  tmp.replace(path)


def load_samples(path) -> list[list[Sample]]:
  """What :func:`save_samples` wrote, episode by episode."""
  from etils import epath
  with epath.Path(path).open("rb") as f:
    z = dict(np.load(f))
  out: dict[int, list[Sample]] = {}
  start = 0
  for n, e in zip(z["lengths"], z["episode"]):
    sl = slice(start, start + int(n))
    out.setdefault(int(e), []).append(Sample(z["ids"][sl], z["gen_mask"][sl], z["logprobs"][sl],
                                             z["turn_ids"][sl], int(e), z["weight_versions"][sl]))
    start += int(n)
  return [out[k] for k in sorted(out)]
