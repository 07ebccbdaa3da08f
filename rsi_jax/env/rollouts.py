"""Rollout collection (training phases, the RSR funnel, evaluation): which tasks, in which order, seeded how.

* :func:`pick_tasks` — up to n tasks of a loaded suite, round-robin over families (``env.max_tasks``,
  ``eval.max_tasks``, an RSR phase's families).
* :class:`TaskOrder` — a grain ``IndexSampler`` over the task pool (seeded shuffle, a new permutation each
  epoch): request index i of a phase always draws the same task, so the phase's rollout cursor (requests
  made so far) is the whole state of its data order, checkpointed with the weights.
* :class:`RolloutPolicy` — the sampler as one episode sees it: abortable, and with ``rollout.deterministic``
  every request seeded from (run seed, phase, step, request index, call number), so an episode's tokens do
  not depend on what else the sampler was doing or on whether the run was resumed.
* :func:`collect` — submits ``rollout.requested`` episodes, keeps ``rollout.global_batch`` (the first to
  finish, or, deterministic, the first by request index) and stops the rest.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import threading

import grain.python as grain

from rsi_jax.env.episode import EpisodeAborted
from rsi_jax.policy import SamplingParams


def derive_seed(*parts) -> int:
  """A 31-bit seed from any tuple of ints / strings (stable across processes and Python versions)."""
  h = hashlib.sha256(repr(tuple(parts)).encode()).digest()
  return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def pick_tasks(tasks, n: int):
  """Up to n tasks (0 = all), round-robin over families so every family is represented."""
  if n <= 0 or n >= len(tasks):
    return list(tasks)
  by_family: dict[str, list] = {}
  for t in tasks:
    by_family.setdefault(t.family, []).append(t)
  out, i = [], 0
  while len(out) < n:
    for fam in sorted(by_family):
      if i < len(by_family[fam]) and len(out) < n:
        out.append(by_family[fam][i])
    i += 1
  return out


class TaskOrder:
  """Random access to the task of request index i: shuffled epochs over the pool, each task repeated
  ``responses_per_task`` times at consecutive indices."""

  def __init__(self, tasks, seed: int, responses_per_task: int = 1):
    if not tasks:
      raise ValueError("empty task pool")
    self.tasks = list(tasks)
    self.k = int(responses_per_task)
    self._sampler = grain.IndexSampler(num_records=len(self.tasks), shard_options=grain.NoSharding(),
                                       shuffle=True, num_epochs=None, seed=int(seed))

  def __getitem__(self, i: int):
    return self.tasks[self._sampler[i // self.k].record_key]


class RolloutPolicy:
  """The policy one rollout episode talks to: the sampler, with

  * an abort switch: once ``abort`` is set, the request in flight is cancelled in the sampler and every
    call raises :class:`EpisodeAborted` (the pool then removes the container without verifying);
  * with ``seed`` set (``rollout.deterministic``), the n-th call samples with ``derive_seed(seed, n)``."""

  def __init__(self, sampler, abort: threading.Event, seed: int | None = None):
    self.sampler, self.abort, self.seed = sampler, abort, seed
    self.calls = 0

  @property
  def max_prompt_tokens(self):
    return getattr(self.sampler, "max_prompt_tokens", None)

  def generate(self, prompt_ids, params: SamplingParams):
    if self.seed is not None:
      params = dataclasses.replace(params, seed=derive_seed(self.seed, self.calls))
    self.calls += 1
    if self.abort.is_set():
      raise EpisodeAborted("aborted before a sampler call")
    fut = self.sampler.submit(prompt_ids, params)
    while True:
      try:
        return fut.result(timeout=0.05)
      except cf.TimeoutError:
        if self.abort.is_set():
          self.sampler.cancel(fut)
          raise EpisodeAborted("aborted during a sampler call") from None
      except cf.CancelledError:
        raise EpisodeAborted("sampler request cancelled") from None


def collect(pool, jobs: list, used: int, *, deterministic: bool) -> tuple[list, int]:
  """Run ``jobs`` ((task, harness, abort event) triples, in request order) in ``pool``; return (the ``used``
  results, in request order, and how many episodes were stopped). Once ``used`` results are in (the first
  to finish, or with ``deterministic`` the first by request index), the others are stopped: not-started
  ones are cancelled, running ones aborted (sampler request cancelled, container removed: a running command
  or verification ends with it),
  and waited for, so none is left behind."""
  futs = [pool.submit(t, h, abort=ev) for t, h, ev in jobs]  # an abort also ends a running command or verifier
  if deterministic:
    got = [f.result() for f in futs[:used]]
    keep = set(futs[:used])
  else:
    keep = set()
    for f in cf.as_completed(futs):
      keep.add(f)
      if len(keep) == used:
        break
    got = [f.result() for f in futs if f in keep]
  rest = [(f, ev) for f, (_, _, ev) in zip(futs, jobs) if f not in keep]
  for f, ev in rest:
    ev.set()
    f.cancel()
  cf.wait([f for f, _ in rest if not f.cancelled()])
  return got, len(rest)
