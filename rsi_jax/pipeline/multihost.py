"""Multi-host runs: one JAX process per host, every process running the same program (multi-controller).

How a run splits across processes (``jax.process_count()`` of them, one per TPU VM host or GPU node):

* **Rollouts are process-local.** Each process runs its share of a step's episode requests
  (:func:`process_share`: a contiguous block of the request indices) in its own Docker environments, against
  a sampler on its own local devices (``sampler.num_devices`` of ``jax.local_devices()``). With oversampling
  each process keeps the first finished (or, ``rollout.deterministic``, the first by index) of its own block,
  so a deterministic run repeats exactly for the same process count.
* **The learner batch is global.** The finished episodes are exchanged host to host (:func:`gather_objects`,
  a few MB of token ids and records per step), so every process holds the same trajectory batch in process
  order and computes the same packing plan; each process then places only the rows that live on its own
  devices (:func:`global_array`). The update is one SPMD program over the learner mesh, which spans every
  process.
* **Weight sync goes from the learner mesh to each sampler** (:func:`to_local`): a parameter sharded across
  processes is gathered leaf by leaf into a replica on each process's devices (one leaf at a time, so the
  peak is one whole leaf), then copied onto the sampler's local mesh.

In a single process every function here is the identity of its multi-process meaning (a share of all
requests, a gather of one list, a copy), so the same code path runs on a laptop and on a pod.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec


def initialize() -> None:
  """``jax.distributed.initialize`` for one process of several.

  On a Cloud TPU slice or under SLURM / Open MPI JAX finds the coordinator itself (``--distributed`` on
  ``rsi_jax.train``); elsewhere ``RSI_COORDINATOR`` (``host:port``), ``RSI_NUM_PROCESSES`` and
  ``RSI_PROCESS_ID`` say it. CPU processes exchange collectives over gloo."""
  env = os.environ.get
  jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices only; TPU/GPU use their own
  jax.distributed.initialize(
      coordinator_address=env("RSI_COORDINATOR"),
      num_processes=int(env("RSI_NUM_PROCESSES")) if env("RSI_NUM_PROCESSES") else None,
      process_id=int(env("RSI_PROCESS_ID")) if env("RSI_PROCESS_ID") else None)


def process_share(n: int) -> range:
  """The indices of ``range(n)`` this process takes: a contiguous block, the first ``n % count`` processes
  one more, so the blocks in process order are ``range(n)`` in order."""
  index, count = jax.process_index(), jax.process_count()
  base, extra = divmod(n, count)
  start = index * base + min(index, extra)
  return range(start, start + base + (index < extra))


def gather_objects(items: Sequence) -> list:
  """Every process's ``items`` (picklable), concatenated in process order, on every process. Items one
  process cannot pickle fail the call on every process (none is left waiting)."""
  if jax.process_count() == 1:
    return list(items)
  try:
    blob = pickle.dumps(("ok", list(items)), protocol=pickle.HIGHEST_PROTOCOL)
  except Exception as e:  # noqa: BLE001 - reported on every process
    blob = pickle.dumps(("error", f"{type(e).__name__}: {e}"))
  out, errors = [], []
  for i, b in enumerate(_allgather_bytes(blob)):
    status, value = pickle.loads(b)
    if status == "error":
      errors.append(f"process {i}: {value}")
    else:
      out.extend(value)
  if errors:
    raise RuntimeError(f"gathering across processes failed: {'; '.join(errors)}")
  return out


def _allgather_bytes(blob: bytes) -> list[bytes]:
  from jax.experimental import multihost_utils
  data = np.frombuffer(blob, np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int64))).reshape(-1)
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:data.size] = data
  rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
  return [row[:int(n)].tobytes() for row, n in zip(rows, sizes)]


def global_array(host, sharding: jax.sharding.Sharding) -> jax.Array:
  """A global array from a host array every process holds whole: each process places only its own devices'
  shards (``jax.device_put`` across processes would first all-gather the whole array to check it is the
  same everywhere: traffic and memory that grow with the process count, on every learner input)."""
  host = np.asarray(host)
  if sharding.is_fully_addressable:
    return jax.device_put(host, sharding)
  return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def to_local(params, shardings):
  """``params`` (a pytree of arrays on any mesh, possibly spanning processes) copied onto ``shardings`` (a
  matching pytree of shardings over this process's devices): the learner -> sampler weight transfer. Always a
  copy (the learner may donate its buffers to its next update)."""
  if all(getattr(x, "is_fully_addressable", True) for x in jax.tree.leaves(params)):
    return jax.device_put(params, shardings, may_alias=False)  # one process: one batched transfer

  def one(x, sh):
    if getattr(x, "is_fully_addressable", True):
      return jax.device_put(x, sh, may_alias=False)
    whole = _replicate(x)  # every process holds the whole leaf on its devices
    return jax.device_put(whole.addressable_data(0), sh, may_alias=False)

  return jax.tree.map(one, params, shardings)


def _identity(a):
  return a


def _replicate(x: jax.Array) -> jax.Array:
  return jax.jit(_identity, out_shardings=NamedSharding(x.sharding.mesh, PartitionSpec()))(x)


def process_index() -> int:
  return jax.process_index()


def is_primary() -> bool:
  """The first process: the one that writes the run's records (metrics, lineage, reports, console)."""
  return jax.process_index() == 0


class PrimaryFailed(RuntimeError):
  """What the other processes raise when a :func:`from_primary` computation failed on the first process."""


def from_primary(fn, *args, **kwargs):
  """``fn(*args, **kwargs)`` run on the first process only and its result (picklable) handed to every process
  (the others wait in the exchange): work whose output every process needs but one should do (RSR's funnel,
  a reward table calibrated from files). An exception on the first process is raised there and, as
  :class:`PrimaryFailed` with its message, on the others."""
  if jax.process_count() == 1:
    return fn(*args, **kwargs)
  err, blob = None, b""
  if is_primary():
    try:  # the result is pickled here too: whatever fails, the other processes still get an answer
      blob = pickle.dumps(("ok", fn(*args, **kwargs)), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 - handed to every process, then raised
      err = e
      blob = pickle.dumps(("error", f"{type(e).__name__}: {e}"))
  status, value = pickle.loads(_broadcast_bytes(blob))
  if err is not None:
    raise err
  if status == "error":
    raise PrimaryFailed(f"on the first process: {value}")
  return value


def _broadcast_bytes(blob: bytes) -> bytes:
  """The first process's ``blob`` on every process (one copy travels, not one per process)."""
  from jax.experimental import multihost_utils
  n = int(np.asarray(multihost_utils.broadcast_one_to_all(np.array(len(blob), np.int64))))
  data = np.frombuffer(blob, np.uint8) if is_primary() else np.zeros(n, np.uint8)
  return np.asarray(multihost_utils.broadcast_one_to_all(data)).tobytes()


def sum_counts(counts: dict) -> dict:
  """Integer counters summed over every process."""
  total: dict = {}
  for c in gather_objects([dict(counts)]):
    for k, v in c.items():
      total[k] = total.get(k, 0) + v
  return total
