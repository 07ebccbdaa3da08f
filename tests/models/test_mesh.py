"""build_mesh: MaxText axis names, auto axis, DCN grouping, and errors naming the mesh key."""

import jax
import numpy as np
import pytest

from rsi_jax.config import ConfigError, load_config
from rsi_jax.models.mesh import MESH_AXES, batch_sharding, build_mesh


def _cfg(**mesh):
  return load_config(None, [f"mesh.{k}={v}" for k, v in mesh.items()])


def test_fsdp_tensor_mesh_has_maxtext_axes():
  mesh = build_mesh(_cfg(ici_fsdp_parallelism=4, ici_tensor_parallelism=2))
  assert mesh.axis_names == MESH_AXES
  assert dict(mesh.shape)["fsdp"] == 4 and dict(mesh.shape)["tensor"] == 2
  assert mesh.devices.size == 8 and len(set(mesh.devices.flat)) == 8


def test_auto_axis_takes_the_rest():
  mesh = build_mesh(_cfg(ici_data_parallelism=2, ici_fsdp_parallelism=-1))
  assert dict(mesh.shape)["data"] == 2 and dict(mesh.shape)["fsdp"] == 4


def test_dcn_axis_groups_devices_slowest():
  mesh = build_mesh(_cfg(dcn_data_parallelism=2, ici_fsdp_parallelism=4))
  assert dict(mesh.shape)["data"] == 2 and dict(mesh.shape)["fsdp"] == 4
  arr = mesh.devices.reshape(2, 4)
  # one process here: the device list is split in halves, each half one DCN group
  ids = np.vectorize(lambda d: d.id)(arr)
  assert sorted(ids[0]) == sorted(d.id for d in jax.devices()[:4])


def test_wrong_product_names_the_key():
  with pytest.raises(ConfigError, match="mesh.ici_fsdp_parallelism"):
    build_mesh(_cfg(ici_fsdp_parallelism=2, ici_tensor_parallelism=2))
  with pytest.raises(ConfigError, match="mesh.ici_fsdp_parallelism"):
    build_mesh(_cfg(ici_fsdp_parallelism=-1, ici_tensor_parallelism=3))


def test_batch_not_divisible_names_the_key():
  with pytest.raises(ConfigError, match="mesh.ici_fsdp_parallelism"):
    build_mesh(_cfg(ici_fsdp_parallelism=8), batch_size=12)
  build_mesh(_cfg(ici_fsdp_parallelism=8), batch_size=16)


def test_subset_of_devices_and_batch_sharding():
  mesh = build_mesh(_cfg(ici_fsdp_parallelism=-1), devices=jax.devices()[:2])
  assert dict(mesh.shape)["fsdp"] == 2
  x = jax.device_put(np.zeros((4, 3)), batch_sharding(mesh))
  assert x.sharding.shard_shape(x.shape) == (2, 3)
