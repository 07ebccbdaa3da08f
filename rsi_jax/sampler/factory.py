"""The engine the ``sampler`` config section describes: its mesh, its MaxText config, the memory it needs.

:func:`build_engine` picks :class:`~rsi_jax.sampler.engine.Engine` (``slot`` / ``maxtext`` decode) or
:class:`~rsi_jax.sampler.paged.PagedEngine` (``paged``), the latter checked against the devices' memory.
"""

from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from rsi_jax.config import Config
from rsi_jax.sampler.engine import Engine
from rsi_jax.sampler.paged import PagedEngine


def sampler_mesh(num_devices: int = 1, devices=None) -> jax.sharding.Mesh:
  """A mesh over ``devices`` (default: the first ``num_devices`` of this process's) with every device on
  MaxText's tensor axis.

  MaxText replicates the decode cache over its batch axes, so tensor parallelism is the useful split here.
  """
  from rsi_jax.models.mesh import MESH_AXES
  devices = list(devices) if devices is not None else jax.local_devices()[:num_devices]
  shape = [len(devices) if a == "tensor" else 1 for a in MESH_AXES]
  return jax.sharding.Mesh(np.array(devices).reshape(shape), MESH_AXES)


def maxtext_sampler_config(cfg: Config, mesh: jax.sharding.Mesh):
  """MaxText config for decoding: the actor's model keys plus the sampler's cache geometry.

  MaxText allocates an autoregressive batch of ``per_device_batch_size x len(jax.devices())``, so the
  per-device batch is chosen to make it exactly ``sampler.num_slots``.
  """
  from rsi_jax.models.actor import build_maxtext_config
  s = cfg.sampler
  n_dev = len(jax.devices())
  mt = build_maxtext_config(cfg, mesh, max_prefill_predict_length=s.max_prefill_length,
                            max_target_length=s.max_cache_length, per_device_batch_size=s.num_slots / n_dev,
                            attention="dot_product")
  if mt.micro_batch_size_to_train_on != s.num_slots:
    raise ValueError(f"sampler.num_slots={s.num_slots} is not representable as a per-device batch over "
                     f"{n_dev} devices (MaxText gives {mt.micro_batch_size_to_train_on})")
  return mt


def build_engine(cfg: Config, devices=None) -> Engine:
  """The engine the ``sampler`` config section describes, on ``devices`` (default: the first
  ``sampler.num_devices``). A paged engine whose pool and weights do not fit the devices' memory is an
  error naming ``sampler.kv_blocks``."""
  s = cfg.sampler
  mesh = sampler_mesh(s.num_devices, devices)
  mt = maxtext_sampler_config(cfg, mesh)
  if s.decode_impl != "paged":
    return Engine(mt, mesh, s.prefill_buckets, logits_dtype=cfg.model.logits_dtype, decode_impl=s.decode_impl,
                  attention_block=s.attention_block)
  kv_blocks = s.kv_blocks or s.num_slots * -(-s.max_cache_length // s.block_size)
  engine = PagedEngine(mt, mesh, block_size=s.block_size, kv_blocks=kv_blocks, prefill_chunk=s.prefill_chunk,
                       logits_dtype=cfg.model.logits_dtype, prefill_buckets=s.prefill_buckets)
  check_fits(engine)
  return engine


def device_memory_bytes(device) -> int | None:
  """Memory one device offers: the allocator's limit on GPU/TPU, physical memory on CPU (all virtual CPU
  devices share it); None when unknown."""
  try:
    stats = device.memory_stats()
  except Exception:  # noqa: BLE001 - some backends do not implement it
    stats = None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  if device.platform == "cpu":
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  return None


def check_fits(engine) -> None:
  """Raise ValueError if the engine's KV pool plus its weights exceed the memory of its devices (on CPU the
  host's memory, shared by every virtual device; elsewhere each device holds 1/n of both)."""
  params = sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(engine._abs_params))
  devices = list(engine.mesh.devices.flat)
  share = 1 if devices[0].platform == "cpu" else len(devices)
  need = (engine.kv_bytes + params) / share
  have = device_memory_bytes(devices[0])
  if have is not None and need > 0.9 * have:
    raise ValueError(
        f"sampler.kv_blocks={engine.kv_blocks} (x block_size {engine.block_size}) needs "
        f"{engine.kv_bytes / 2**30:.2f} GiB of KV cache, plus {params / 2**30:.2f} GiB of weights: "
        f"{need / 2**30:.2f} GiB per device, over 90% of the {have / 2**30:.2f} GiB available; lower "
        f"sampler.kv_blocks")
