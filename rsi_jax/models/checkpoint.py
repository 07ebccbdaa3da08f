"""Param-only Orbax checkpoints with separate items ``actor`` and ``critic`` (weights only, paper App. A:
phases transfer weights, never optimizer or RNG state).

Layout: ``<directory>/actor/`` and ``<directory>/critic/`` (Orbax composite checkpoint). Either item may be
absent. Restoring places every array straight into the given shardings (each host reads only its shards).
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp

ITEMS = ("actor", "critic")


def save_params(directory: str, *, actor: dict | None = None, critic: dict | None = None,
                force: bool = False) -> str:
  """Write the given param trees (sharded jax arrays) as one checkpoint. Collective under multi-host:
  every process must call it. Returns the absolute directory."""
  directory = os.path.abspath(os.fspath(directory))
  items = {k: ocp.args.StandardSave(v) for k, v in (("actor", actor), ("critic", critic)) if v is not None}
  if not items:
    raise ValueError("save_params: nothing to save (give actor= and/or critic=)")
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
    ckptr.save(directory, args=ocp.args.Composite(**items), force=force)
  return directory


def saved_items(directory: str) -> tuple[str, ...]:
  """Which of ``actor`` / ``critic`` a checkpoint holds."""
  return tuple(k for k in ITEMS if os.path.isdir(os.path.join(directory, k)))


def abstract_like(shardings: dict, shapes: dict) -> dict:
  """ShapeDtypeStructs with shardings (restore targets) from a shardings tree and a shape/dtype tree."""
  return jax.tree.map(lambda s, a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shardings, shapes)


def restore_params(directory: str, *, actor=None, critic=None) -> dict:
  """Restore the requested items onto the given targets.

  ``actor`` / ``critic``: a tree of ``jax.ShapeDtypeStruct`` with shardings (e.g. ``Actor.abstract_params``,
  ``Critic.abstract_params``) or of arrays whose shardings to copy. Returns ``{"actor": ..., "critic": ...}``
  with only the requested items. A missing item raises FileNotFoundError naming it."""
  directory = os.path.abspath(os.fspath(directory))
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
