"""One sharded actor+critic train step on an 8-device mesh (fsdp 4 x tensor 2), for the two-process test.

As a script: ``python mp_worker.py PORT PROCESS_ID CKPT_DIR`` joins a 2-process ``jax.distributed`` run on loopback
(4 fake CPU devices per process, gloo collectives), prints ``LOSS <floats>``, then imports an HF fixture and
round-trips a checkpoint on the global mesh and prints ``CHECKS <hf logits error> <restore error>``."""

import os
import sys

import numpy as np

B, T, V = 8, 16, 256
OVERRIDES = [f"model.vocab_size={V}", "model.max_target_length=32", "mesh.ici_fsdp_parallelism=4",
             "mesh.ici_tensor_parallelism=2", "actor_optim.learning_rate=1e-3", "critic_optim.learning_rate=1e-3"]


def batch_np():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, V, (B, T)).astype(np.int32)
  segs = np.ones((B, T), np.int32)
  segs[:, -2:] = 0
  mask = (segs > 0).astype(np.float32)
  return {"tokens": tokens, "positions": np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy(),
          "segment_ids": segs, "mask": mask, "returns": rng.normal(size=(B, T)).astype(np.float32)}


def joint_step_losses(n_steps=2):
  """Loss of ``n_steps`` joint (SFT NLL + value MSE) steps from a fixed init, on all global devices."""
  import jax

  from rsi_jax.config import load_config
  from rsi_jax.models.actor import Actor
  from rsi_jax.models.critic import Critic
  from rsi_jax.models.mesh import batch_sharding, build_mesh
  from rsi_jax.models.optim import init_train_state, make_optimizer, make_train_step, masked_nll_loss

  cfg = load_config(None, OVERRIDES)
  mesh = build_mesh(cfg)
  actor, critic = Actor(cfg, mesh), Critic(cfg, mesh)
  params = actor.init(jax.random.PRNGKey(0))
  cparams = critic.init_from_actor(params, jax.random.PRNGKey(1))
  nll, values = masked_nll_loss(actor), critic.values_fn()

  def loss_fn(a, c, batch):
    l1, _ = nll(a, None, batch)
    v = values(c, batch["tokens"], batch["positions"], batch["segment_ids"])
    return l1 + ((v - batch["returns"]) ** 2 * batch["mask"]).sum() / batch["mask"].sum(), {}

  opt, copt = make_optimizer(cfg.actor_optim), make_optimizer(cfg.critic_optim)
  step = make_train_step(actor, opt, loss_fn, critic=critic, critic_optimizer=copt)
  state = init_train_state(actor, opt, params, critic, copt, cparams)
  # every process holds the same host batch and places only its addressable shards
  batch = {k: jax.make_array_from_callback(v.shape, batch_sharding(mesh, v.ndim), lambda i, v=v: v[i])
           for k, v in batch_np().items()}
  losses = []
  for _ in range(n_steps):
    state, loss, _ = step(state, batch)
    losses.append(float(loss))  # replicated scalar: readable on every process
  return losses


def hf_and_checkpoint_checks(ckpt_dir):
  """Import the tied HF fixture onto the global mesh (max |logits - HF golden|) and round-trip the params
  through a param-only checkpoint written by all processes (max |restored - saved|)."""
  import jax
  import jax.numpy as jnp

  from rsi_jax.config import load_config
  from rsi_jax.models.actor import Actor
  from rsi_jax.models.checkpoint import restore_params, save_params
  from rsi_jax.models.from_hf import hf_logits
  from rsi_jax.models.hf_import import config_for_hf, load_hf_params
  from rsi_jax.models.mesh import build_mesh

  d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf_qwen3_tied")
  g = np.load(os.path.join(d, "golden.npz"))
  tokens, want = np.concatenate([g["tokens"], g["tokens"][:1]]), np.concatenate([g["logits"], g["logits"][:1]])
  cfg = config_for_hf(d, load_config(None, OVERRIDES[2:4]))
  actor = Actor(cfg, build_mesh(cfg))
  hf_err = float(np.abs(hf_logits(d, tokens, actor=actor) - want).max())
  params = load_hf_params(d, actor)
  save_params(ckpt_dir, actor=params, force=True)
  restored = restore_params(ckpt_dir, actor=actor.abstract_params)["actor"]
  diff = jax.jit(lambda a, b: jnp.stack([jnp.abs(x - y).max() for x, y in zip(jax.tree.leaves(a),
                                                                              jax.tree.leaves(b))]).max())
  return hf_err, float(diff(params, restored))


if __name__ == "__main__":
  port, pid = sys.argv[1], int(sys.argv[2])
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
  assert jax.device_count() == 8 and jax.local_device_count() == 4
  print("LOSS", " ".join(repr(x) for x in joint_step_losses()), flush=True)
  print("CHECKS", *hf_and_checkpoint_checks(sys.argv[3]), flush=True)
  # a DCN axis splits the mesh by process: data index i holds exactly process i's devices
  from rsi_jax.config import load_config
  from rsi_jax.models.mesh import build_mesh

  m = build_mesh(load_config(None, ["mesh.dcn_data_parallelism=2", "mesh.ici_fsdp_parallelism=4"]))
  procs = np.vectorize(lambda d: d.process_index)(m.devices).reshape(2, 4)
  print("DCN", int((procs == np.arange(2)[:, None]).all()), flush=True)
  jax.distributed.shutdown()
