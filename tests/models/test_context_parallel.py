"""Context parallelism (``mesh.ici_context_parallelism``: MaxText's ``context`` axis splits the sequence over
devices, for trajectories too long for one device): on 8 CPU devices, context 2 and 4 give the single-device
losses and gradients of the actor's log-probabilities and the critic's values, packed rows included."""

import jax
import numpy as np
import optax
import pytest

from rsi_jax.config import CONFIG_DIR, load_config
from rsi_jax.models import Actor, Critic, build_mesh
from rsi_jax.models.actor import target_index
from rsi_jax.models.mesh import batch_sharding

pytestmark = pytest.mark.slow

T = 256


def _batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 5000, (4, T)).astype(np.int32)
  seg = np.ones((4, T), np.int32)
  seg[0, 100:] = 2  # a packed row: two samples
  seg[1, 200:] = 0  # padding
  pos = np.zeros((4, T), np.int32)
  for r in range(4):
    for k in np.unique(seg[r][seg[r] > 0]):
      pos[r, seg[r] == k] = np.arange((seg[r] == k).sum())
  mask = ((rng.random((4, T)) < 0.5) & (seg > 0) & (pos > 0)).astype(np.float32)
  returns = rng.normal(size=(4, T)).astype(np.float32)
  return {"tokens": tokens, "positions": pos, "segment_ids": seg, "mask": mask, "returns": returns}


def _run(context: int, host_params):
  devices = 1 if context == 0 else 8
  cfg = load_config(CONFIG_DIR / "smoke.yml", [f"model.max_target_length={T}", "mesh.ici_tensor_parallelism=1",
                                               f"mesh.ici_context_parallelism={max(context, 1)}",
                                               "mesh.ici_fsdp_parallelism=-1"])
  mesh = build_mesh(cfg, jax.devices()[:devices])
  actor, critic = Actor(cfg, mesh), Critic(cfg, mesh)
  if host_params is None:
    a = actor.init(jax.random.key(0))
    host_params = jax.device_get((a, critic.init_from_actor(a, jax.random.key(1))))
  a, c = (jax.device_put(p, m.param_shardings) for p, m in zip(host_params, (actor, critic)))
  b = {k: jax.device_put(v, batch_sharding(mesh, v.ndim)) for k, v in _batch().items()}
  index = target_index(_batch()["mask"])
  logp_fn, values_fn = actor.token_logprobs_fn(), critic.values_fn()

  def loss(a, c):
    lp = logp_fn(a, b["tokens"], b["positions"], b["segment_ids"], index=index)
    v = values_fn(c, b["tokens"], b["positions"], b["segment_ids"])
    nll = -(lp * b["mask"]).sum() / b["mask"].sum()
    mse = ((v - b["returns"]) ** 2 * b["mask"]).sum() / b["mask"].sum()
    return nll + mse, (nll, mse)

  (total, parts), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(a, c)
  hidden = jax.jit(actor.final_hidden).lower(a, b["tokens"], b["positions"], b["segment_ids"]).compile()
  spec = hidden.output_shardings.spec
  return (float(parts[0]), float(parts[1]), float(optax.global_norm(grads[0])),
          float(optax.global_norm(grads[1]))), spec, dict(mesh.shape), host_params


def test_context_parallel_losses_equal_single_device():
  ref, _, _, params = _run(0, None)
  for context in (2, 4):
    got, spec, shape, _ = _run(context, params)
    assert shape["context"] == context and shape["fsdp"] == 8 // context
    # the hidden states are split along the sequence over the context axis
    assert len(spec) > 1 and "context" in np.atleast_1d(spec[1]).tolist(), spec
    np.testing.assert_allclose(got, ref, rtol=2e-5, err_msg=f"context={context}")
