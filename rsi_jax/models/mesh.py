"""Device mesh from the ``mesh`` config section, with MaxText's axis names.

The mesh always carries every axis MaxText's logical axis rules refer to (``data``, ``fsdp``, ``tensor``, ...),
most of size 1, so MaxText's rules resolve unchanged. Our config exposes the axes we use:
ICI (within a slice / host) ``data``, ``fsdp``, ``tensor``, ``context`` (the sequence split over devices:
context parallelism) and DCN (across slices / hosts) ``data``, ``fsdp``. A DCN axis of size n splits the
devices into n groups by slice (TPU) or by process (CPU/GPU hosts), and that group index varies slowest
along the mesh axis, as in MaxText's hybrid mesh.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh

from rsi_jax.config import Config, ConfigError

# MaxText 0.2.5 configs/base.yml `mesh_axes`, in order.
MESH_AXES = ("diloco", "data", "stage", "fsdp", "fsdp_transpose", "context", "context_usp_ulysses",
             "context_autoregressive", "tensor", "tensor_sequence", "expert", "autoregressive")

# our mesh key -> MaxText mesh axis
_ICI_KEYS = {"ici_data_parallelism": "data", "ici_fsdp_parallelism": "fsdp",
             "ici_tensor_parallelism": "tensor", "ici_context_parallelism": "context"}
_DCN_KEYS = {"dcn_data_parallelism": "data", "dcn_fsdp_parallelism": "fsdp"}
BATCH_AXES = ("data", "fsdp")  # the batch axis of activations is split over these


def resolve_parallelism(cfg: Config, num_devices: int) -> tuple[dict, dict]:
  """(ici, dcn): our mesh keys -> sizes, with the one ``-1`` axis filled in.

  Raises ConfigError naming the mesh key when the sizes cannot multiply to ``num_devices``."""
  m = cfg.mesh
  dcn = {k: getattr(m, k) for k in _DCN_KEYS}
  ici = {k: getattr(m, k) for k in _ICI_KEYS}
  for k, v in dcn.items():
    if v == -1:
      raise ConfigError(f"mesh.{k}: -1 is only supported on ICI axes")
  n_dcn = math.prod(dcn.values())
  if num_devices % n_dcn:
    key = next((k for k, v in dcn.items() if v > 1), "dcn_data_parallelism")
    raise ConfigError(f"mesh.{key}: DCN axes ({n_dcn}) do not divide the {num_devices} devices")
  per_group = num_devices // n_dcn
  auto = [k for k, v in ici.items() if v == -1]
  fixed = math.prod(v for v in ici.values() if v != -1)
  if auto:
    if per_group % fixed:
      raise ConfigError(f"mesh.{auto[0]}: the other ICI axes ({fixed}) do not divide the {per_group} "
                        f"devices per DCN group")
    ici[auto[0]] = per_group // fixed
  elif fixed != per_group:
    key = next((k for k, v in ici.items() if v > 1), "ici_fsdp_parallelism")
    raise ConfigError(f"mesh.{key}: ICI axes multiply to {fixed} x DCN {n_dcn} = {fixed * n_dcn}, "
                      f"but there are {num_devices} devices")
  return ici, dcn


def build_mesh(cfg: Config, devices=None, batch_size: int | None = None) -> Mesh:
  """A ``jax.sharding.Mesh`` over ``devices`` (default: all, every process) with MaxText's axis names.

  ``batch_size`` (optional): a global batch that must split evenly over the batch axes (data x fsdp);
  ConfigError names the mesh key otherwise.
  """
  devices = list(jax.devices() if devices is None else devices)
  ici, dcn = resolve_parallelism(cfg, len(devices))
  ici_shape = [1] * len(MESH_AXES)
  dcn_shape = [1] * len(MESH_AXES)
  for k, v in ici.items():
    ici_shape[MESH_AXES.index(_ICI_KEYS[k])] = v
  for k, v in dcn.items():
    dcn_shape[MESH_AXES.index(_DCN_KEYS[k])] = v
  if batch_size is not None:
    shards = math.prod(ici_shape[MESH_AXES.index(a)] * dcn_shape[MESH_AXES.index(a)] for a in BATCH_AXES)
    if batch_size % shards:
      key = "ici_fsdp_parallelism" if ici["ici_fsdp_parallelism"] > 1 else "ici_data_parallelism"
      raise ConfigError(f"mesh.{key}: batch {batch_size} is not divisible by the batch shards "
                        f"(data x fsdp = {shards})")
  n_dcn = math.prod(dcn_shape)
  try:
    if n_dcn == 1:
      # a logical axis may split a physical one (tensor 2 on a 4x8x4 torus)
      arr = mesh_utils.create_device_mesh(ici_shape, devices, contiguous_submeshes=False,
                                          allow_split_physical_axes=True) \
          if len(devices) > 1 else np.array(devices).reshape(ici_shape)
    else:
      arr = _hybrid(ici_shape, dcn_shape, devices)
  except (NotImplementedError, ValueError) as e:
    raise ConfigError(f"mesh: these ICI sizes do not map onto the devices' physical layout: {e}") from None
  return Mesh(arr, MESH_AXES)


def _hybrid(ici_shape, dcn_shape, devices) -> np.ndarray:
  """Devices grouped by slice (or process) along the DCN axes, each group an ICI mesh."""
  key = (lambda d: d.slice_index) if getattr(devices[0], "slice_index", None) is not None else (
      lambda d: d.process_index)
  groups: dict = {}
  for d in devices:
    groups.setdefault(key(d), []).append(d)
  n_dcn = math.prod(dcn_shape)
  if len(groups) != n_dcn:
    # Fewer slices / processes than DCN groups (e.g. one host): split the device list evenly.
    per = len(devices) // n_dcn
    groups = {i: devices[i * per:(i + 1) * per] for i in range(n_dcn)}
  per_group = [np.array(sorted(g, key=lambda d: d.id)).reshape(ici_shape) for _, g in sorted(groups.items())]
  stacked = np.stack(per_group).reshape(dcn_shape + ici_shape)  # (dcn..., ici...)
  n = len(ici_shape)
  # interleave: axis i of the mesh = (dcn_i, ici_i) with dcn slowest
  perm = [x for i in range(n) for x in (i, n + i)]
  return stacked.transpose(perm).reshape([a * b for a, b in zip(dcn_shape, ici_shape)])


def batch_sharding(mesh: Mesh, ndim: int = 2) -> jax.sharding.NamedSharding:
  """Sharding of a (B, T, ...) input batch: rows over data x fsdp, the rest replicated."""
  spec = jax.sharding.PartitionSpec(BATCH_AXES, *([None] * (ndim - 1)))
  return jax.sharding.NamedSharding(mesh, spec)


def batch_shards(mesh: Mesh) -> int:
  """How many ways the batch axis is split (data x fsdp, DCN included)."""
  return math.prod(int(mesh.shape.get(a, 1)) for a in BATCH_AXES)
