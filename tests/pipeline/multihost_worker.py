"""One process of the multi-host RPR test (tests/pipeline/test_multihost.py), or its single-process reference.

    python tests/pipeline/multihost_worker.py OUT_JSON            # RSI_COORDINATOR etc. set: one of several

Each process runs its share of 8 episode requests against a sampler on its own first local device (the
learner's weights synced to it), the episodes are gathered into one global batch, one joint RPR step runs
on the learner mesh over every process's devices (fsdp 4 x tensor 2), and the new weights are synced back to
each sampler. Writes what the test compares: the episodes it generated, the global batch, the step's
metrics and checksums of the learner's and the sampler's weights. Before that, every process imports an HF
checkpoint from its own copy of the folder: the same files, then process 1's copy with one tensor changed.
"""

import hashlib
import json
import os
import shutil
import sys

from rsi_jax.pipeline import multihost

if os.environ.get("RSI_COORDINATOR"):
  multihost.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rsi_jax.config import CONFIG_DIR, load_config  # noqa: E402
from rsi_jax.models import Actor, Critic, build_mesh  # noqa: E402
from rsi_jax.pipeline.rpr import RPRTrainer  # noqa: E402
from rsi_jax.policy import SamplingParams  # noqa: E402
from rsi_jax.rl.batch import Sample, assemble_batch  # noqa: E402
from rsi_jax.sampler.engine import model_params  # noqa: E402
from rsi_jax.sampler.factory import build_engine  # noqa: E402
from rsi_jax.sampler.server import SamplerServer  # noqa: E402

REQUESTS = 8


def checksum(tree) -> float:
  """Sum of every parameter (float64 on the host; a jitted sum for arrays spanning processes)."""
  total = 0.0
  for x in jax.tree.leaves(tree):
    s = jax.jit(lambda a: jnp.sum(a.astype(jnp.float32)))(x)
    total += float(np.asarray(s.addressable_data(0)))
  return total


def exchanges() -> dict:
  """The host-to-host exchanges, including their failures (no process may be left waiting)."""
  out = {"share": list(multihost.process_share(5)), "gathered": multihost.gather_objects([jax.process_index()] * 2),
         "from_primary": multihost.from_primary(lambda: f"made by {jax.process_index()}"),
         "counts": multihost.sum_counts({"episodes": 3, f"only_{jax.process_index()}": 1})}

  def fail():
    raise ValueError("no tasks on this host")

  try:
    multihost.from_primary(fail)
  except Exception as e:  # noqa: BLE001
    out["primary_failed"] = f"{type(e).__name__}: {e}"
  try:  # process 1 hands over something pickle cannot carry
    multihost.gather_objects([lambda: 0] if jax.process_index() == 1 else [1])
  except Exception as e:  # noqa: BLE001
    out["unpicklable"] = f"{type(e).__name__}: {e}"

  # a stop notice that cut one process's work stops every process at the same exchange (none left waiting)
  from rsi_jax.stop import StopRequested

  def cut():
    raise StopRequested("SIGTERM")

  mine = "SIGTERM" if jax.process_index() == 1 else None  # only the last process got the notice
  for name, call in (("primary_stopped", lambda: multihost.from_primary(cut)),
                     ("share_stopped", lambda: multihost.gather_or_stop([jax.process_index()], mine)),
                     ("none_stopped", lambda: multihost.gather_or_stop([jax.process_index()], None))):
    try:
      out[name] = call()
    except StopRequested as e:
      out[name] = f"StopRequested: {e.args[0]}"
  return out


HF_FIXTURE = os.path.join(os.path.dirname(__file__), "..", "models", "fixtures", "hf_qwen3_tied")


def hf_import(work: str) -> dict:
  """Each process imports the HF fixture from its own copy (as each host of a pod reads its own disk): the
  same files, then process 1's copy with ``model.norm.weight`` changed, then without its weights file."""
  from safetensors.numpy import load_file, save_file

  from rsi_jax.models.hf_import import HFImportError, config_for_hf, load_hf_params

  out = {}
  cfg = config_for_hf(HF_FIXTURE, load_config(None, ["mesh.ici_fsdp_parallelism=4", "mesh.ici_tensor_parallelism=2"]))
  actor = Actor(cfg, build_mesh(cfg))
  for case in ("same", "changed_on_1", "missing_on_1"):
    d = os.path.join(work, f"hf_{case}_{jax.process_index()}")
    shutil.copytree(HF_FIXTURE, d, dirs_exist_ok=True)
    if case == "changed_on_1" and jax.process_index() == 1:
      tensors = load_file(os.path.join(d, "model.safetensors"))
      tensors["model.norm.weight"] = tensors["model.norm.weight"] + 1
      save_file(tensors, os.path.join(d, "model.safetensors"))
    if case == "missing_on_1" and jax.process_index() == 1:
      os.remove(os.path.join(d, "model.safetensors"))
    try:
      out[f"hf_{case}"] = checksum(load_hf_params(d, actor))
    except HFImportError as e:
      out[f"hf_{case}"] = f"{type(e).__name__}: {e}".replace(work, "WORK")
  return out


def main(out_path: str):
  ex = exchanges()
  ex.update(hf_import(os.path.dirname(os.path.abspath(out_path))))
  cfg = load_config(CONFIG_DIR / "smoke.yml", [
      "mesh.ici_fsdp_parallelism=4", "mesh.ici_tensor_parallelism=2", "rl.minibatches=1", "rl.ppo_epochs=1",
      "rl.pad_multiple=16", "rl.per_device_token_budget=32", "sampler.num_slots=2", "sampler.max_cache_length=64",
      "sampler.kv_blocks=4", "sampler.block_size=16", "sampler.prefill_chunk=16", "sampler.max_prefill_length=16",
      "sampler.prefill_buckets=[16]", "rollout.max_input_tokens=32", "model.max_target_length=64"])
  mesh = build_mesh(cfg)  # every process's devices
  actor, critic = Actor(cfg, mesh), Critic(cfg, mesh)
  a = actor.init(jax.random.key(0))
  c = critic.init_from_actor(a, jax.random.key(1))
  trainer = RPRTrainer(cfg, actor, critic)
  state = trainer.init_state(a, c, train_actor=True)
  before = checksum(state.actor)

  # this process's share of the requests, on a sampler over its own first local device
  engine = build_engine(cfg, jax.local_devices()[:1])
  server = SamplerServer(engine, state.actor, eos_token_ids=(), decode_steps=2)
  mine = list(multihost.process_share(REQUESTS))
  local = []
  for k in mine:
    prompt = [100 + k, 200, 300 + 7 * k, 400, 500 + k]
    out = server.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=6, seed=k))
    n = len(out.token_ids)
    ids = np.array(prompt + [int(t) for t in out.token_ids])
    gen = np.r_[np.zeros(len(prompt), bool), np.ones(n, bool)]
    lp = np.r_[np.zeros(len(prompt), np.float32), out.logprobs].astype(np.float32)
    ver = np.where(gen, out.weight_version, -1).astype(np.int32)
    local.append([Sample(ids, gen, lp, np.zeros(len(ids), int), k, ver)])
  episodes = multihost.gather_objects(local)
  rewards = [float(s[0].episode % 3) / 2 for s in episodes]
  batch = assemble_batch(episodes, rewards, pad_multiple=16)
  state, m = trainer.step(state, batch, train_actor=True, version=server.weight_version)

  server.update_weights(state.actor)
  server.wait_swapped(timeout=300)
  sampler_sum = checksum(model_params(server._params))
  learner_sum = checksum(state.actor)
  server.close()
  result = {
      "process": jax.process_index(), "processes": jax.process_count(), "devices": jax.device_count(),
      "local_devices": [d.id for d in jax.local_devices()], "requests": mine,
      "local_episodes": [[int(x) for x in s[0].ids] for s in local],
      "global_episodes": [int(s[0].episode) for s in episodes],
      "batch_tokens": batch.tokens.tolist(),
      "batch_sha": hashlib.sha256(batch.tokens.tobytes()).hexdigest(),
      "loss": float(m["loss"]), "policy_loss": float(m["policy/loss"]), "value_loss": float(m["value/loss"]),
      "updates": int(m["updates"]), **ex, "before": before, "learner_after": learner_sum, "sampler_after": sampler_sum,
  }
  with open(out_path, "w") as f:
    json.dump(result, f)


if __name__ == "__main__":
  main(sys.argv[1])
