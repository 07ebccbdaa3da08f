"""Phase checkpoints: one Orbax ``CheckpointManager`` per phase, step-numbered folders.

Layout: ``<checkpoint root>/<phase>/<step>/`` with the items

* ``actor``, ``critic``: param trees (the same item names as :func:`rsi_jax.models.checkpoint.save_params`,
  so :func:`~rsi_jax.models.checkpoint.restore_params` reads a phase step folder too);
* ``actor_opt``, ``critic_opt``: the optimizer states of the roles the phase trains (absent for a frozen role);
* ``meta``: JSON — phase, step, the update counter, the phase RNG key, the rollout cursor, the reward-table
  digest, which items the step holds.

Writes are asynchronous (Orbax copies device arrays to host before ``save`` returns, then writes in the
background); a step folder appears only once complete, so the newest step is always a whole checkpoint, even
after SIGKILL. Paths go to Orbax unchanged: ``gs://...`` URLs work where the storage backend is installed.
"""

from __future__ import annotations

import jax
import orbax.checkpoint as ocp

from rsi_jax.models.checkpoint import join, local_or_url
from rsi_jax.models.optim import TrainState, opt_state_shardings


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
    """Start writing ``state`` (params and optimizer states present in it) and ``meta`` as ``step``."""
    items = {}
    for name, tree in (("actor", state.actor), ("critic", state.critic), ("actor_opt", state.actor_opt),
                       ("critic_opt", state.critic_opt)):
      if tree is not None:
        items[name] = ocp.args.StandardSave(tree)
    meta = dict(meta, items=sorted(items), update=int(jax.device_get(state.step)))
    items["meta"] = ocp.args.JsonSave(meta)
    self._mngr.save(step, args=ocp.args.Composite(**items), force=True)
    return self.step_dir(step)

  def read_meta(self, step: int) -> dict:
    return dict(self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])

  def restore(self, step: int, targets: dict) -> tuple[dict, dict]:
    """Restore ``step``'s items onto ``targets`` (item name -> tree of ShapeDtypeStructs with shardings);
    returns (trees, meta). Items the step does not hold are not requested."""
    meta = self.read_meta(step)
    args = {k: ocp.args.StandardRestore(t) for k, t in targets.items() if k in meta["items"]}
    out = self._mngr.restore(step, args=ocp.args.Composite(**args)) if args else {}
    return {k: out[k] for k in args}, meta

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
