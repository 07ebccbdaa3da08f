"""Param-only Orbax checkpoints with separate items ``actor`` and ``critic`` (weights only, paper App. A:
phases transfer weights, never optimizer or RNG state).

Layout: ``<directory>/actor/`` and ``<directory>/critic/`` (Orbax composite checkpoint), and ``meta/``: JSON
with the items and their digests (:func:`params_digest`, taken when they were written). Either tree item may
be absent. Restoring places every array straight into the given shardings (each host reads only its shards).

Every restore is verified (:func:`restore_verified`, also used for the phase checkpoints of
:mod:`rsi_jax.pipeline.checkpoints`, whose ``meta`` item holds the digests too): the stored shapes must be
this model's, the files must read, and each item's digest must be the recorded one. Anything else is a
:class:`CheckpointError` with a one-line message. A checkpoint written before digests were recorded is
restored with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

ITEMS = ("actor", "critic")
META = "meta"  # the JSON item: {"items": [...], "digests": {item: params_digest}} (phase checkpoints: more)

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
  """A checkpoint that does not restore as it was written: an item whose digest differs from the recorded
  one (files changed or corrupted), an item that cannot be read (truncated or missing file, decompression
  error, half-written folder) or whose tree is not this model's (another size). The message is one line
  naming the checkpoint folder, the item and what differs."""


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


def item_digests(trees: dict) -> dict:
  """``{item: params_digest(tree)}`` for the trees that are not None: what a checkpoint records when written
  (computed on device before an asynchronous write starts; 8 bytes per leaf reach the host)."""
  return {k: params_digest(v) for k, v in trees.items() if v is not None}


def save_params(directory: str, *, actor: dict | None = None, critic: dict | None = None,
                force: bool = False) -> str:
  """Write the given param trees (sharded jax arrays) as one checkpoint, with their digests in the ``meta``
  item (written in the same atomic commit as the trees). Collective under multi-host: every process must
  call it. Returns the absolute directory (a URL unchanged)."""
  directory = local_or_url(directory)
  trees = {k: v for k, v in (("actor", actor), ("critic", critic)) if v is not None}
  if not trees:
    raise ValueError("save_params: nothing to save (give actor= and/or critic=)")
  items = {k: ocp.args.StandardSave(v) for k, v in trees.items()}
  items[META] = ocp.args.JsonSave({"items": sorted(trees), "digests": item_digests(trees)})
  with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
    ckptr.save(directory, args=ocp.args.Composite(**items), force=force)
  return directory


def saved_items(directory: str) -> tuple[str, ...]:
  """Which of ``actor`` / ``critic`` a checkpoint holds."""
  return tuple(k for k in ITEMS if (epath.Path(directory) / k).is_dir())


def restore_params(directory: str, *, actor=None, critic=None) -> dict:
  """Restore the requested items onto the given targets, verified against the digests recorded when they
  were written (:func:`restore_verified`; CheckpointError when they do not restore as written).

  ``actor`` / ``critic``: a tree of ``jax.ShapeDtypeStruct`` with shardings (e.g. ``Actor.abstract_params``,
  ``Critic.abstract_params``) or of arrays whose shardings to copy. Returns ``{"actor": ..., "critic": ...}``
  with only the requested items. A missing item raises FileNotFoundError naming it. ``directory`` may also
  be a phase folder of step-numbered checkpoints (its newest step is read)."""
  directory = resolve_checkpoint(local_or_url(directory))
  have = saved_items(directory)
  targets = {}
  for name, target in (("actor", actor), ("critic", critic)):
    if target is None:
      continue
    if name not in have:
      raise FileNotFoundError(f"{directory}: checkpoint has no {name!r} item (has {list(have)})")
    targets[name] = target
  if not targets:
    raise ValueError("restore_params: nothing to restore (give actor= and/or critic= targets)")
  meta = read_meta(directory)
  return restore_verified(directory, targets, None if meta is None else meta.get("digests"))


def read_meta(directory: str) -> dict | None:
  """The JSON ``meta`` item of a checkpoint folder (its phase step meta, or the digests of
  :func:`save_params`), read straight from its file; None when the folder has none (an older checkpoint).
  CheckpointError when it cannot be read."""
  f = epath.Path(directory) / META / "metadata"  # the file Orbax's JsonCheckpointHandler writes
  try:
    if not f.exists():
      return None
    meta = json.loads(f.read_text())
    if not isinstance(meta, dict):
      raise ValueError(f"a JSON {type(meta).__name__}, not an object")
  except Exception as e:  # noqa: BLE001 - any failure to read it is the checkpoint's
    raise CheckpointError(f"checkpoint {directory}: item {META!r} cannot be read: {_first_line(e)}") from e
  return meta


def restore_verified(directory: str, targets: dict, digests: dict | None) -> dict:
  """Restore each item of ``targets`` (name -> tree of ``ShapeDtypeStruct`` with shardings, or of arrays
  whose shardings to copy) from the checkpoint folder ``directory`` and verify it.

  ``digests``: ``{item: params_digest}`` recorded when the checkpoint was written; None for a checkpoint
  written before digests were recorded (restored unverified, with a logged warning). Each item must have
  this model's leaves and shapes (checked on the stored metadata before reading), read without error and
  have the recorded digest; otherwise CheckpointError. An item stored in another dtype than its target is
  verified as stored, then cast. Returns ``{item: tree}``."""
  directory = str(directory)
  if digests is None and targets:
    log.warning("checkpoint %s: no digests recorded (written by an older version): %s restored unverified",
                directory, ", ".join(targets))
  out = {}
  for name, target in targets.items():
    where = f"checkpoint {directory}: item {name!r}"
    recorded = None
    if digests is not None:
      if name not in digests:
        raise CheckpointError(f"{where} has no digest among those recorded when it was written "
                              f"({sorted(digests)}): the checkpoint's meta was changed")
      recorded = digests[name]
    out[name] = _restore_item(directory, name, where, _abstract(target), recorded)
  return out


def _first_line(e: BaseException) -> str:
  """The first non-empty line of the innermost error behind ``e`` that has a message: Orbax wraps
  tensorstore's specific one (``OUT_OF_RANGE: Error reading "<leaf>/<chunk>" ...``) in a page-long dump."""
  chain = [e]
  while (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None and nxt not in chain:
    chain.append(nxt)
  for x in reversed(chain):
    lines = [line.strip() for line in str(x).splitlines() if line.strip()]
    if lines:
      return lines[0] if len(lines[0]) <= 400 else lines[0][:397] + "..."
  return type(e).__name__


def _abstract(target):
  return jax.tree.map(
      lambda x: x if isinstance(x, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                                                    sharding=x.sharding),
      target)


def _leaf_name(path) -> str:
  # the dotted leaf name Orbax uses (``decoder.layers.mlp.wo.kernel``, ``1.0.mu.decoder...``)
  return ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _named_leaves(tree, is_leaf=None) -> dict:
  return {_leaf_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]}


def _restore_item(directory: str, name: str, where: str, target, recorded: str | None):
  handler = ocp.StandardCheckpointHandler()
  try:
    stored = handler.metadata(epath.Path(directory) / name)
    stored = _named_leaves(getattr(stored, "tree", stored), is_leaf=lambda x: hasattr(x, "shape"))
  except Exception as e:  # noqa: BLE001 - Orbax / tensorstore raise many kinds
    raise CheckpointError(f"{where} cannot be read: {_first_line(e)}") from e
  finally:
    handler.close()
  want = _named_leaves(target)
  missing, extra = sorted(set(want) - set(stored)), sorted(set(stored) - set(want))
  if missing or extra:
    diff = "; ".join(f"{what} {', '.join(ks[:3])}{' ...' if len(ks) > 3 else ''}"
                     for what, ks in (("missing", missing), ("not in this model", extra)) if ks)
    raise CheckpointError(f"{where} has other leaves than this model: {diff}")
  for k, t in want.items():
    if tuple(stored[k].shape) != tuple(t.shape):
      raise CheckpointError(f"{where} has another shape than this model: {k} {tuple(stored[k].shape)} in the "
                            f"checkpoint vs {tuple(t.shape)} here")
  # read as stored (the digest covers the stored dtype), cast to the target's dtype afterwards
  as_stored = jax.tree_util.tree_map_with_path(
      lambda p, t: jax.ShapeDtypeStruct(t.shape, stored[_leaf_name(p)].dtype, sharding=t.sharding), target)
  try:
    with ocp.Checkpointer(ocp.CompositeCheckpointHandler()) as ckptr:
      tree = ckptr.restore(directory, args=ocp.args.Composite(**{name: ocp.args.StandardRestore(as_stored)}))
      tree = tree[name]
  except Exception as e:  # noqa: BLE001 - Orbax / tensorstore raise many kinds
    raise CheckpointError(f"{where} cannot be read: {_first_line(e)}") from e
  if recorded is not None:
    got = params_digest(tree)
    if got != recorded:
      raise CheckpointError(f"{where} does not match the digest recorded when it was written (recorded "
                            f"{recorded}, read {got}): the files were changed or corrupted")
  return jax.tree.map(lambda x, t: x if x.dtype == t.dtype else x.astype(t.dtype), tree, target)


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
