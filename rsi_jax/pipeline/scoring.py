"""Score and filter a rollout step's episodes: rewards, the infrastructure and staleness masks, the batch.

:func:`score_and_filter` is a pure function of the step's episodes (``rsi_jax.env.episode.EpisodeResult`` or
anything with its ``outcome``, ``family``, ``segments``, ``failure_kind`` and ``stop_reason``), the phase's
divisor table and the sampler's weight version: it touches no sampler, container, trainer or file. The phase
(:class:`~rsi_jax.pipeline.rollout_phase.RolloutPhase`) writes the outcome rows and transcripts from what it returns.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

import numpy as np

from rsi_jax.pipeline.errors import InvariantError, NoTrainableSamples
from rsi_jax.rl.batch import TrajectoryBatch, assemble_batch, episode_samples
from rsi_jax.rl.rewards import outcome_rewards


@dataclasses.dataclass(frozen=True)
class ScoredStep:
  """What a rollout step trains on. Per-episode arrays are (E,), in the episodes' order."""
  rewards: np.ndarray  # float32: the terminal reward (FDR / SPR); 0 for infrastructure failures
  mask: np.ndarray  # float32: 1 for a scored episode, 0 for an infrastructure failure (never scored)
  too_old: np.ndarray  # bool: a generated token was sampled more than max_staleness updates ago
  ok: np.ndarray  # bool: scored and fresh enough (mask > 0 and not too_old): the episodes trained on
  trainable: list[int]  # indices of the ok episodes that generated at least one token
  batch: TrajectoryBatch  # every episode's rows, those not ok masked out


def score_and_filter(episodes: Sequence, table, kind: str, version: int, max_staleness: int, *,
                     pad_multiple: int, pad_id: int, where: str) -> ScoredStep:
  """Rewards of the step's episodes under ``table`` (a divisor table, ``reward.kind`` = ``kind``), the
  infrastructure mask, the staleness bound and the assembled batch.

  The staleness bound (§3.1): an episode with a generated token sampled by weights more than ``max_staleness``
  updates older than ``version`` (the weights being trained now) is not trained. Raises
  :class:`NoTrainableSamples` (``where``: the phase and step, naming the episodes' stop reasons) when no
  episode is left with a generated token to train on, and :class:`InvariantError` unless the batch holds
  exactly one terminal reward per trainable episode, nowhere else.
  """
  eps = episodes
  rewards, mask = outcome_rewards([e.outcome for e in eps], [e.family for e in eps], kind, table)
  samples = [episode_samples(e.segments, j) for j, e in enumerate(eps)]
  oldest = [min([int(x.weight_versions[x.gen_mask].min()) for x in ss if x.gen_mask.any()], default=version)
            for ss in samples]
  too_old = np.array([version - o > max_staleness for o in oldest], bool)
  ok = (mask > 0) & ~too_old
  batch = assemble_batch(samples, rewards, ok, pad_multiple=pad_multiple, pad_id=pad_id)
  trainable = [j for j, s in enumerate(samples) if ok[j] and any(x.gen_mask.any() for x in s)]
  if not trainable:
    why = Counter(e.failure_kind or e.stop_reason or "no generated token" for e in eps)
    raise NoTrainableSamples(f"{where}: none of the {len(eps)} episodes has a trainable "
                             f"generated token ({dict(why)}): infrastructure failures "
                             f"{int((mask == 0).sum())}, too stale {int(too_old.sum())}")
  # Invariant: one terminal reward per trainable episode that generated tokens, nowhere else.
  if int(batch.dones.sum()) != len(trainable) or np.count_nonzero(batch.rewards[batch.dones == 0]):
    raise InvariantError(f"{where}: rewards placed {int(batch.dones.sum())} times for "
                         f"{len(trainable)} trainable episodes")
  return ScoredStep(rewards, mask, too_old, ok, trainable, batch)
