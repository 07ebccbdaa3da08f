"""Multi-host runs: one JAX process per host, every process running the same program (multi-controller).

How a run splits across processes (``jax.process_count()`` of them, one per TPU VM host or GPU node):

* **Rollouts are process-local.** Each process runs its share of a step's episode requests
  (:func:`process_share`: a contiguous block of the request indices) in its own Docker environments, against
  a sampler on its own local devices (``sampler.num_devices`` of ``jax.local_devices()``). With oversampling
  each process keeps the first finished (or, ``rollout.deterministic``, the first by index) of its own block,
  so a deterministic run repeats exactly for the same process count.
* **The learner batch is global.** The finished episodes are exchanged host to host (:func:`gather_objects`
  of :meth:`~rsi_jax.env.episode.EpisodeResult.for_exchange`: each episode's segments, outcome and records,
  not its turns' prompt ids, so linear in its generated and observation tokens), so every process holds the
  same trajectory batch in process order and computes the same packing plan; each process then places only
  the rows that live on its own devices (:func:`global_array`). The update is one SPMD program over the
  learner mesh, which spans every process.
* **Weight sync goes from the learner mesh to each sampler** (:func:`to_local`): a parameter sharded across
  processes is gathered leaf by leaf into a replica on each process's devices (one leaf at a time, so the
  peak is one whole leaf), then copied onto the sampler's local mesh.

In a single process every function here is the identity of its multi-process meaning (a share of all
requests, a gather of one list, a copy), so the same code path runs on a laptop and on a pod. The primitives
(gather, broadcast, placement, weight copy) are :mod:`rsi_jax.distributed`'s, re-exported here; this module adds
the training program's split of the work.
"""

from __future__ import annotations

import jax

from rsi_jax.distributed import (PrimaryFailed, from_primary, gather_objects, gather_or_stop, global_array,
                                 initialize, is_primary, process_index, sum_counts, to_local)

__all__ = ["PrimaryFailed", "from_primary", "gather_objects", "gather_or_stop", "global_array", "initialize",
           "is_primary", "process_index", "process_share", "sum_counts", "to_local"]


def process_share(n: int) -> range:
  """The indices of ``range(n)`` this process takes: a contiguous block, the first ``n % count`` processes
  one more, so the blocks in process order are ``range(n)`` in order."""
  index, count = jax.process_index(), jax.process_count()
  base, extra = divmod(n, count)
  start = index * base + min(index, extra)
  return range(start, start + base + (index < extra))
