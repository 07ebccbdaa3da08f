"""Param-only Orbax checkpoints with separate items ``actor`` and ``critic`` (weights only, paper App. A:
phases transfer weights, never optimizer or RNG state).

Layout: ``<directory>/actor/`` and ``<directory>/critic/`` (Orbax composite checkpoint). Either item may be
absent. Restoring places every array straight into the given shardings (each host reads only its shards).
"""

from __future__ import annotations

import hashlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

ITEMS = ("actor", "critic")


def local_or_url(path) -> str:
  """An absolute local path, or an object-store URL (``gs://bucket/x``) exactly as given: Orbax reads and
  writes both, and a URL must not be turned into a local path."""
  path = os.fspath(path)
  return path if "://" in path else os.path.abspath(path)


def join(root, *parts: str) -> str:
  """``root/part/...`` as a string, keeping URL roots intact."""
  out = os.fspath(root).rstrip("/")
  for p in parts:
    out = f"{out}/{str(p).strip('/')}"
  return out


@jax.jit
def _leaf_fingerprint(x):
  # the leaf's bits as uint32 words, summed plain and position-weighted (wrapping): a change of any bit
  # changes the pair; computed where the (sharded) leaf lives, so only 8 bytes per leaf reach the host
  if x.dtype.itemsize == 4:
    u = jax.lax.bitcast_convert_type(x, jnp.uint32)
  elif x.dtype.itemsize == 2:
    u = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
  else:
    u = x.astype(jnp.uint32)
  u = u.reshape(-1)
  w = jnp.arange(u.size, dtype=jnp.uint32) * jnp.uint32(2654435761) + jnp.uint32(1)
  return jnp.stack([u.sum(dtype=jnp.uint32), (u * w).sum(dtype=jnp.uint32)])


def params_digest(params) -> str:
  """A content fingerprint of a param tree (lineage, and the Δφ = 0 check across RSR phases): structure,
  shapes, dtypes and every bit of every leaf, reduced on device (cheap at pod scale)."""
  h = hashlib.sha256()
  leaves, treedef = jax.tree_util.tree_flatten(params)
  h.update(str(treedef).encode())
  sums = [_leaf_fingerprint(x) for x in leaves]
  for x, s in zip(leaves, jax.device_get(sums)):
    h.update(f"{x.shape}{x.dtype}".encode() + np.asarray(s, np.uint32).tobytes())
  return h.hexdigest()[:16]


def save_params(directory: str, *, actor: dict | None = None, critic: dict | None = None,
                force: bool = False) -> str:
  """Write the given param trees (sharded jax arrays) as one checkpoint. Collective under multi-host:
  every process must call it. Returns the absolute directory (a URL unchanged)."""
  directory = local_or_url(directory)
  items = {k: ocp.args.StandardSave(v) for k, v in (("actor", actor), ("critic", critic)) if v is not None}
  if not items:
    raise ValueError("save_params: nothing to save (give actor= and/or critic=)")
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
    ckptr.save(directory, args=ocp.args.Composite(**items), force=force)
  return directory


def saved_items(directory: str) -> tuple[str, ...]:
  """Which of ``actor`` / ``critic`` a checkpoint holds."""
  return tuple(k for k in ITEMS if (epath.Path(directory) / k).is_dir())


def abstract_like(shardings: dict, shapes: dict) -> dict:
  """ShapeDtypeStructs with shardings (restore targets) from a shardings tree and a shape/dtype tree."""
  return jax.tree.map(lambda s, a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shardings, shapes)


def restore_params(directory: str, *, actor=None, critic=None) -> dict:
  """Restore the requested items onto the given targets.

  ``actor`` / ``critic``: a tree of ``jax.ShapeDtypeStruct`` with shardings (e.g. ``Actor.abstract_params``,
  ``Critic.abstract_params``) or of arrays whose shardings to copy. Returns ``{"actor": ..., "critic": ...}``
  with only the requested items. A missing item raises FileNotFoundError naming it. ``directory`` may also
  be a phase folder of step-numbered checkpoints (its newest step is read)."""
  directory = resolve_checkpoint(local_or_url(directory))
  have = saved_items(directory)
  items = {}
  for name, target in (("actor", actor), ("critic", critic)):
    if target is None:
      continue
    if name not in have:
      raise FileNotFoundError(f"{directory}: checkpoint has no {name!r} item (has {list(have)})")
    target = jax.tree.map(
        lambda x: x if isinstance(x, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                                                      sharding=x.sharding),
        target)
    items[name] = ocp.args.StandardRestore(target)
  if not items:
    raise ValueError("restore_params: nothing to restore (give actor= and/or critic= targets)")
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
    out = ckptr.restore(directory, args=ocp.args.Composite(**items))
  return {k: out[k] for k in items}


def resolve_checkpoint(path: str) -> str:
  """A folder holding ``actor`` / ``critic`` items: ``path`` itself, or, for a phase folder of step-numbered
  checkpoints (``<phase>/<step>/``), its newest step holding them. FileNotFoundError says what was found."""
  p = epath.Path(path)
  if not p.exists():
    raise FileNotFoundError(f"checkpoint {path}: does not exist")
  if any((p / k).is_dir() for k in ITEMS):
    return str(path)
  steps = sorted(int(c.name) for c in p.iterdir()
                 if c.name.isdigit() and any((c / k).is_dir() for k in ITEMS))
  if not steps:
    raise FileNotFoundError(f"checkpoint {path}: holds neither actor/critic items nor step folders with them")
  return join(path, str(steps[-1]))
