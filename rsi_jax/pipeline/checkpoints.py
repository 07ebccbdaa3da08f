"""Phase checkpoints: one Orbax ``CheckpointManager`` per phase, step-numbered folders.

Layout: ``<checkpoint root>/<phase>/<step>/`` with the items

* ``actor``, ``critic``: param trees (the same item names as :func:`rsi_jax.models.checkpoint.save_params`,
  so :func:`~rsi_jax.models.checkpoint.restore_params` reads a phase step folder too);
* ``actor_opt``, ``critic_opt``: the optimizer states of the roles the phase trains (absent for a frozen role);
* ``meta``: JSON — phase, step, the update counter, the phase RNG key, the rollout cursor, the reward-table
  digest, which items the step holds and each item's digest (``digests``: ``params_digest`` of each tree,
  taken on device before the write starts).

Writes are asynchronous (Orbax copies device arrays to host before ``save`` returns, then writes in the
background); a step folder appears only once complete, so the newest step is always a whole checkpoint, even
after SIGKILL. Restores are verified against the recorded digests (``CheckpointError`` otherwise, see
:func:`rsi_jax.models.checkpoint.restore_verified`); :meth:`PhaseCheckpoints.restore_newest_intact` resumes
from the newest step that passes. Paths go to Orbax unchanged: ``gs://...`` URLs work where the storage
backend is installed.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

import jax
import orbax.checkpoint as ocp
from etils import epath

from rsi_jax.models.checkpoint import (META, CheckpointError, item_digests, join, local_or_url, read_meta,
                                       restore_verified)
from rsi_jax.models.optim import TrainState, opt_state_shardings
from rsi_jax.pipeline import multihost


class PhaseCheckpoints:
  """The checkpoints of one phase (``directory`` = ``<root>/<phase>``)."""

  def __init__(self, directory: str, *, keep: int, async_save: bool = True):
    self.directory = local_or_url(directory)
    self._mngr = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=async_save))

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._mngr.all_steps())

  def step_dir(self, step: int) -> str:
    return join(self.directory, str(step))

  def save(self, step: int, state: TrainState, meta: dict) -> str:
    """Start writing ``state`` (params and optimizer states present in it) and ``meta`` as ``step``; the
    items' digests go into ``meta`` (computed before the write starts)."""
    trees = {name: tree for name, tree in (("actor", state.actor), ("critic", state.critic),
                                           ("actor_opt", state.actor_opt), ("critic_opt", state.critic_opt))
             if tree is not None}
    items = {k: ocp.args.StandardSave(v) for k, v in trees.items()}
    meta = dict(meta, items=sorted(items), update=int(jax.device_get(state.step)), digests=item_digests(trees))
    items[META] = ocp.args.JsonSave(meta)
    self._mngr.save(step, args=ocp.args.Composite(**items), force=True)
    return self.step_dir(step)

  def read_meta(self, step: int) -> dict:
    """``step``'s meta item; CheckpointError when it is missing or cannot be read."""
    meta = read_meta(self.step_dir(step))
    if meta is None or not isinstance(meta.get("items"), list):
      raise CheckpointError(f"checkpoint {self.step_dir(step)}: item {META!r} is missing or names no items")
    return meta

  def restore(self, step: int, targets: dict) -> tuple[dict, dict]:
    """Restore ``step``'s items onto ``targets`` (item name -> tree of ShapeDtypeStructs with shardings);
    returns (trees, meta). Items the step does not hold are not requested. Every item is verified against
    the digest recorded in ``meta`` (a step written before digests were recorded: a logged warning);
    CheckpointError (one line: the step folder, the item, what differs) when one does not restore as
    written."""
    meta = self.read_meta(step)
    wanted = {k: t for k, t in targets.items() if k in meta["items"]}
    return restore_verified(self.step_dir(step), wanted, meta.get("digests")), meta

  def restore_newest_intact(self, targets: dict) -> tuple[int | None, dict, dict, list[tuple[int, str]]]:
    """Restore the newest step that restores and verifies (:meth:`restore`), trying steps newest first.

    Returns ``(step, trees, meta, skipped)``: ``skipped`` lists ``(step, reason)`` for each newer step that
    was refused (CheckpointError's one-line message). ``step`` is None (``trees`` and ``meta`` empty) when
    no step passes, or the phase has none (then ``skipped`` is empty too)."""
    skipped = []
    for step in sorted(self.all_steps(), reverse=True):
      try:
        trees, meta = self.restore(step, targets)
      except CheckpointError as e:
        skipped.append((step, str(e)))
        continue
      return step, trees, meta, skipped
    return None, {}, {}, skipped

  def set_aside(self, step: int) -> str:
    """Rename a refused step's folder to ``<step>.refused-<unix time>`` (kept for inspection, no longer a
    step of this phase), so that the phase can write that step again. Returns the new path. Collective:
    every process calls it (the first one renames)."""
    def rename():
      src = epath.Path(self.step_dir(step))
      dst = src.parent / f"{step}.refused-{int(time.time())}"
      src.rename(dst)
      return str(dst)

    dst = multihost.from_primary(rename)
    self._mngr.reload()
    return dst

  def wait(self):
    """Block until every started write is on storage."""
    self._mngr.wait_until_finished()

  def close(self):
    self._mngr.wait_until_finished()
    self._mngr.close()


def opt_targets(model, optimizer):
  """Restore targets of ``optimizer.init(params)`` for ``model``'s params: shapes with their shardings."""
  shapes = jax.eval_shape(optimizer.init, model.abstract_params)
  shardings = opt_state_shardings(optimizer, model.abstract_params, model.param_shardings, model.mesh)
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings)


def optimizer_change_hint(changes: Sequence[str], skipped: Sequence[tuple[int, str]]) -> str:
  """Why every step of a phase was refused (``skipped``: (step, reason) each), when the cause is the config and
  not the checkpoints: each refusal concerns an optimizer state and run.allow_config_change let the optimizer's
  settings change (``changes``: the driver's ``key: old -> new``; a schedule, a warmup or clipping gives the state
  another form, which no checkpoint of the phase has). "" otherwise."""
  changed = [c for c in changes if "_optim." in c.split(":", 1)[0]]
  if not (changed and skipped and all(re.search(r"item '(actor|critic)_opt'", why) for _, why in skipped)):
    return ""
  return (f". The cause is the config, not the checkpoints: run.allow_config_change let the optimizer settings "
          f"change ({'; '.join(changed)}), which gives the optimizer state another form than the one this phase's "
          f"checkpoints hold; resume the phase with its own optimizer settings (they may change at a phase "
          f"boundary), or set its checkpoints aside to redo it from its start")
