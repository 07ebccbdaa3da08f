"""Rollout collection for the training phases: which tasks, in which order, seeded how.

* :class:`TaskOrder` — a grain ``IndexSampler`` over the task pool (seeded shuffle, a new permutation each
  epoch): request index i of a phase always draws the same task, so the phase's rollout cursor (requests
  made so far) is the whole state of its data order, checkpointed with the weights.
* :class:`SeededPolicy` — with ``rollout.deterministic``, every sampler request of an episode is seeded from
  (run seed, phase, step, request index, call number), so an episode's tokens do not depend on what else the
  sampler was doing or on whether the run was resumed.
* :func:`collect` — submits ``rollout.requested`` episodes, keeps ``rollout.global_batch``: the first to
  finish, or (deterministic) the first by request index.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib

import grain.python as grain

from rsi_jax.policy import SamplingParams


def derive_seed(*parts) -> int:
  """A 31-bit seed from any tuple of ints / strings (stable across processes and Python versions)."""
  h = hashlib.sha256(repr(tuple(parts)).encode()).digest()
  return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


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

  def take(self, start: int, n: int) -> list:
    return [self[i] for i in range(start, start + n)]


@dataclasses.dataclass
class SeededPolicy:
  """A Policy whose n-th call of one episode samples with seed ``derive_seed(base, n)``."""
  policy: object
  base: int
  calls: int = 0

  @property
  def max_prompt_tokens(self):
    return getattr(self.policy, "max_prompt_tokens", None)

  def generate(self, prompt_ids, params: SamplingParams):
    seed = derive_seed(self.base, self.calls)
    self.calls += 1
    return self.policy.generate(prompt_ids, dataclasses.replace(params, seed=seed))


def collect(pool, jobs: list, used: int, *, deterministic: bool) -> tuple[list, int]:
  """Run ``jobs`` ((task, harness) pairs, in request order) in ``pool``; return (the ``used`` results in
  request order, how many were not used). Jobs not yet started when enough results are in are cancelled;
  running ones finish and are discarded."""
  futs = [pool.submit(t, h) for t, h in jobs]
  if deterministic:
    got = [f.result() for f in futs[:used]]
  else:
    done = set()
    for f in cf.as_completed(futs):
      done.add(f)
      if len(done) == used:
        break
    got = [f.result() for f in futs if f in done]
  for f in futs:
    f.cancel()
  return got, len(jobs) - len(got)
