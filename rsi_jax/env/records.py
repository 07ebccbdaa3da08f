"""An episode as a JSON record and back, exactly: every field of an :class:`~rsi_jax.env.episode.EpisodeResult`,
its turns (the token ids sent and sampled, the sampler's log-probabilities) and its segments (the training
samples). float32 values survive the round trip bit for bit (a float32 is exact as a double, and JSON writes
doubles with their shortest exact repr). Used for the RSR funnel's progress records."""

from __future__ import annotations

import dataclasses

import numpy as np

from rsi_jax.env.harness import Segment, Turn
from rsi_jax.rl.ctrf import CTRFReport, VerificationOutcome, VerificationState

_TURN_ARRAYS = {"prompt_ids": np.int32, "sampled_ids": np.int32, "logprobs": np.float32}
_SEGMENT_ARRAYS = {"ids": np.int32, "gen_mask": np.bool_, "logprobs": np.float32, "turn_ids": np.int32,
                   "weight_versions": np.int32}


def _plain(obj, arrays: dict) -> dict:
  d = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
  for k in arrays:
    d[k] = np.asarray(d[k]).tolist()
  return d


def _typed(cls, d: dict, arrays: dict):
  return cls(**{k: (np.asarray(v, arrays[k]) if k in arrays else v) for k, v in d.items()})


def episode_to_json(res) -> dict:
  """The record of one :class:`~rsi_jax.env.episode.EpisodeResult` (JSON-serializable)."""
  o = res.outcome
  d = {f.name: getattr(res, f.name) for f in dataclasses.fields(res)
       if f.name not in ("outcome", "turns", "segments")}
  d["retried_from"] = list(res.retried_from)
  d["outcome"] = {"state": o.state.value, "success": o.success, "terminal_reward": o.terminal_reward,
                  "exit_code": o.exit_code, "reason": o.reason,
                  "report": None if o.report is None else {**dataclasses.asdict(o.report),
                                                           "warnings": list(o.report.warnings),
                                                           "checks": [list(c) for c in o.report.checks]}}
  d["turns"] = [_plain(t, _TURN_ARRAYS) for t in res.turns]
  d["segments"] = [_plain(s, _SEGMENT_ARRAYS) for s in res.segments]
  return d


def episode_from_json(d: dict):
  """The :class:`~rsi_jax.env.episode.EpisodeResult` of a record from :func:`episode_to_json`."""
  from rsi_jax.env.episode import EpisodeResult
  d = dict(d)
  o = dict(d.pop("outcome"))
  rep = o.pop("report")
  report = None if rep is None else CTRFReport(**{**rep, "warnings": tuple(rep["warnings"]),
                                                  "checks": tuple(tuple(c) for c in rep.get("checks", ()))})
  outcome = VerificationOutcome(VerificationState(o.pop("state")), report=report, **o)
  turns = [_typed(Turn, t, _TURN_ARRAYS) for t in d.pop("turns")]
  segments = [_typed(Segment, s, _SEGMENT_ARRAYS) for s in d.pop("segments")]
  return EpisodeResult(outcome=outcome, turns=turns, segments=segments,
                       **{**d, "retried_from": tuple(d["retried_from"])})
