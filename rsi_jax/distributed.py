"""Multi-process primitives (one JAX process per host): start-up, gather, broadcast, placement, weight copy.

Every function is collective (each process calls it, in the same order) and, in a single process, the identity
of its multi-process meaning (a gather of one list, a copy), so the same code runs on a laptop and on a pod.
How the training program splits its work over processes is :mod:`rsi_jax.pipeline.multihost`.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rsi_jax.stop import StopRequested


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


def gather_objects(items: Sequence) -> list:
  """Every process's ``items`` (picklable), concatenated in process order, on every process. Items one
  process cannot pickle fail the call on every process (none is left waiting)."""
  if jax.process_count() == 1:
    return list(items)
  blob = encode(items)
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


def encode(items: Sequence) -> bytes:
  """The bytes one process sends for ``items`` in :func:`gather_objects` (an unpicklable item becomes the error
  every process reports)."""
  try:
    return pickle.dumps(("ok", list(items)), protocol=pickle.HIGHEST_PROTOCOL)
  except Exception as e:  # noqa: BLE001 - reported on every process
    return pickle.dumps(("error", f"{type(e).__name__}: {e}"))


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
    except StopRequested as e:  # a stop notice cut the work: every process stops at this point
      err = e
      blob = pickle.dumps(("stop", e.args[0] if e.args else "SIGTERM"))
    except Exception as e:  # noqa: BLE001 - handed to every process, then raised
      err = e
      blob = pickle.dumps(("error", f"{type(e).__name__}: {e}"))
  status, value = pickle.loads(_broadcast_bytes(blob))
  if err is not None:
    raise err
  if status == "stop":
    raise StopRequested(value)
  if status == "error":
    raise PrimaryFailed(f"on the first process: {value}")
  return value


def gather_or_stop(items: Sequence, stopped: str | None) -> list:
  """:func:`gather_objects` of every process's ``items``, unless a process's share of the work was cut by a stop
  notice (``stopped``: the signal's name, else None): then :class:`~rsi_jax.stop.StopRequested` on every process,
  at this same exchange, so all of them leave the step together (a process without the notice finishes its share
  first; on a preempted pod every host has it). ``items`` of a stopped process are not sent."""
  if jax.process_count() == 1:
    if stopped is not None:
      raise StopRequested(stopped)
    return list(items)
  got = gather_objects([("stop", stopped)] if stopped is not None else [("ok", list(items))])
  names = [v for status, v in got if status == "stop"]
  if names:
    raise StopRequested(names[0])
  return [x for _, v in got for x in v]


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
