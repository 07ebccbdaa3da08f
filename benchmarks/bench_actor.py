"""Actor forward+backward throughput against MaxText's own pre-training step, same config and batch, one run.

    python benchmarks/bench_actor.py [--steps N] [--batch B] [--seq T] [--devices N] [key=value ...]

``key=value`` are rsi_jax config overrides (e.g. ``model_name=qwen3-0.6b model.remat_policy=minimal``).
Both sides run one jitted optimizer step per iteration on the same (B, T) batch and mesh:

* ours: ``make_train_step`` with a masked NLL loss through ``Actor.token_logprobs`` (chunked float32 log-probs)
  and the AdamW chain from ``actor_optim``;
* MaxText: ``maxtext.trainers.pre_train.train.train_step`` (its cross-entropy over full logits and its AdamW),
  jitted by ``train_utils.jit_train_and_eval_step`` exactly as MaxText's train loop does.

Prints step times, tokens/s, the ratio ours / MaxText, and MFU (MaxText's FLOP count per step over the peak
given by --peak_tflops, default: 989 for H100/H200 dense bf16, only printed on GPU).

Measured (2026-12-04, ``scripts/gpu_check.sh``):

* one H200, jax 0.11.2 + CUDA 13, qwen3-1.7b, batch 4 x seq 8,192, bf16, cudnn_flash_jax attention, remat full
  (``--ppo --steps 3 --batch 4 --seq 8192 model_name=qwen3-1.7b model.attention=cudnn_flash_jax``): MaxText
  991 ms/step, 33,058 tok/s, MFU 43.9%; ours (bf16 LM head) 1,121 ms (ratio 0.88, MFU 38.8%); RPR's joint PPO +
  value step 1,918 ms, 17,081 tok/s, MFU 45.4% (actor and critic FLOPs both counted).

Measured (2026-11-29):

* one H200, jax 0.11.2 + CUDA 13, qwen3-0.6b, batch 1 x seq 8,192, bf16 activations, remat full,
  dot_product attention (``--steps 3 --seq 8192 --batch 1 --also_bf16_logits model_name=qwen3-0.6b``):
  MaxText 581 ms/step, 14,094 tok/s, MFU 9.1%; ours with float32 logits 751 ms (ratio 0.77, MFU 7.1%);
  ours with ``model.logits_dtype=bfloat16`` 604 ms (ratio 0.96, MFU 8.8%). The float32 LM head
  (1,024 x 151,936 at full precision, forward and backward) is what the float32 path costs; the low MFU of both
  is the materialised dot-product attention at 8k with full remat, identical on both sides.
* CPU (1 device, 2 cores), the learning check's step: qwen3-tiny (emb 64, 2 layers, vocab 151,936), batch
  16 x seq 512, loss on the last 48 tokens of each row (``--generated 48 --batch 16 --seq 512 --devices 1
  model_name=qwen3-tiny``): MaxText 23.3 s, ours with the LM head at every position 12.4 s, ours with the LM
  head at the 48 loss positions only (``loss_index``) 1.74 s: 7.1x faster than the full head, 13.4x MaxText.
* CPU (1 device, 2 cores), qwen3-tiny, batch 16 x seq 512, loss on the last 48 tokens (``--ppo --generated
  48 --batch 16 --seq 512 --devices 1 model_name=qwen3-tiny``, 2026-12-01): MaxText's LM step 30.5 s; ours,
  actor-only with the LM head at the 48 loss positions 1.93 s; RPR's joint PPO + value step (actor and
  critic forward and backward, both AdamW updates) 3.43 s: 1.78x the actor-only step, 8.9x MaxText's LM
  step in tokens/s (MaxText computes and keeps the full (B, T, V) logits).
* CPU (1 device, 2 cores), emb 256, 4 layers, vocab 151,936, batch 2 x seq 512, float32: MaxText 7.4 s,
  ours 3.0 s (ratio 2.5: MaxText materialises and keeps the full (B, T, V) logits).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np


def _time(fn, state, batch, steps):
  state, *_ = fn(state, batch)  # compile + first run
  jax.block_until_ready(state)
  times = []
  for _ in range(steps):
    t = time.perf_counter()
    state, *_ = fn(state, batch)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t)
  return float(np.median(times)), state


def ours(cfg, mesh, tokens, positions, segs, steps, logits_dtype=None, generated=0, index=False):
  from rsi_jax.config import with_overrides
  from rsi_jax.models.actor import Actor
  from rsi_jax.models.mesh import batch_sharding
  from rsi_jax.models.optim import init_train_state, make_optimizer, make_train_step, masked_nll_loss

  if logits_dtype:
    cfg = with_overrides(cfg, {"model": {"logits_dtype": logits_dtype}})
  actor = Actor(cfg, mesh)
  opt = make_optimizer(cfg.actor_optim)
  step = make_train_step(actor, opt, masked_nll_loss(actor))
  state = init_train_state(actor, opt, actor.init(jax.random.PRNGKey(0)))
  mask = (segs > 0).astype(np.float32)
  if generated:  # the loss reads the last `generated` tokens of each row (an RL / SFT row: prompt + reply)
    mask[:, :-generated] = 0
  data = dict(tokens=tokens, positions=positions, segment_ids=segs, mask=mask)
  if index:  # the LM head at the loss positions only, as RSRPhase / RPRTrainer run it
    from rsi_jax.models.actor import target_index
    data["loss_index"] = target_index(mask)
  batch = {k: jax.device_put(v, batch_sharding(mesh)) for k, v in data.items()}
  t, _ = _time(step, state, batch, steps)
  return t


def ppo(cfg, mesh, tokens, positions, segs, steps, generated=0):
  """The joint PPO + value step of RPR (``RPRTrainer``'s fused step: actor log-probs at the generated
  positions, critic values at every position, both backward passes and both AdamW updates) on one pass."""
  from rsi_jax.models import Actor, Critic
  from rsi_jax.models.actor import target_index
  from rsi_jax.models.mesh import batch_sharding
  from rsi_jax.pipeline.rpr import RPRTrainer

  actor, critic = Actor(cfg, mesh), Critic(cfg, mesh)
  a = actor.init(jax.random.PRNGKey(0))
  tr = RPRTrainer(cfg, actor, critic)
  state = tr.start_actor(tr.init_state(a, critic.init_from_actor(a, jax.random.PRNGKey(1)), False))
  gen = (segs > 0).astype(np.float32)
  gen[:, 0] = 0
  if generated:
    gen[:, :-generated] = 0
  rng = np.random.default_rng(1)
  b, t = tokens.shape
  data = dict(tokens=tokens, positions=positions, segment_ids=segs, gen_mask=gen, loss_index=target_index(gen),
              **{k: (rng.normal(size=(b, t)) * gen).astype(np.float32)
                 for k in ("old_logp", "advantages", "old_values", "returns")})
  batch = {k: jax.device_put(v, batch_sharding(mesh, v.ndim)) for k, v in data.items()}
  batch["num_samples"] = np.float32(b)
  t_step, _ = _time(tr._joint_step, state, batch, steps)
  return t_step


def maxtext(cfg, mesh, tokens, positions, segs, steps):
  from flax import nnx
  from flax.linen import partitioning as nn_partitioning
  from maxtext.common import train_state_nnx
  from maxtext.trainers.pre_train import train as mt_train
  from maxtext.utils import maxtext_utils, model_creation_utils, sharding, train_utils

  from rsi_jax.models.actor import build_maxtext_config

  b, t = tokens.shape
  mt = build_maxtext_config(cfg, mesh, per_device_batch_size=b / mesh.devices.size, max_target_length=t,
                            steps=steps + 2, dataset_type="synthetic", enable_goodput_recording=False,
                            learning_rate=cfg.actor_optim.learning_rate, adam_b1=cfg.actor_optim.b1,
                            adam_b2=cfg.actor_optim.b2, adam_eps=cfg.actor_optim.eps,
                            adam_weight_decay=cfg.actor_optim.weight_decay,
                            gradient_clipping_threshold=cfg.actor_optim.grad_clip)
  rules = mt.logical_axis_rules
  with nn_partitioning.axis_rules(rules):
    create, model = model_creation_utils.create_nnx_abstract_model(mt, mesh)
    _, tx = train_utils.create_training_optimizer(mt, model, mesh=mesh)

    def init_state_fn():
      m = create()
      return train_state_nnx.TrainStateNNX(m, nnx.Optimizer(m, tx, wrt=nnx.Param))

    state, _, state_sh, _, _ = maxtext_utils.setup_training_state(None, mt, mesh, None, init_state_fn)
    # as train_utils.setup_train_loop + train_loop: merge into the TrainStateNNX module, split again
    state = nnx.merge(nnx.graphdef(nnx.eval_shape(init_state_fn)), state)
    graphdef, state = nnx.split(state)
    params_sh, state_sh = sharding.maybe_update_params_sharding_with_opt(mt, state_sh)
    p_step, _ = train_utils.jit_train_and_eval_step(mt, graphdef, mesh, state, state_sh, mt_train.train_step,
                                                    mt_train.eval_step, None, params_sh)
  data_sh = sharding.get_input_data_sharding(mt, mesh)
  targets = np.concatenate([tokens[:, 1:], np.zeros((b, 1), tokens.dtype)], 1)
  tseg = segs.copy()
  tseg[:, -1] = 0
  data = dict(inputs=tokens, inputs_position=positions, inputs_segmentation=segs, targets=targets,
              targets_segmentation=tseg)
  data = jax.device_put(data, data_sh)
  with jax.set_mesh(mesh), nn_partitioning.axis_rules(rules):
    dt, _ = _time(p_step, state, data, steps)
  return dt, mt


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--steps", type=int, default=3)
  ap.add_argument("--batch", type=int, default=0, help="global batch (default: one row per device)")
  ap.add_argument("--seq", type=int, default=256)
  ap.add_argument("--devices", type=int, default=0, help="use the first N devices (default: all)")
  ap.add_argument("--peak_tflops", type=float, default=989.0)
  ap.add_argument("--also_bf16_logits", action="store_true", help="also time model.logits_dtype=bfloat16")
  ap.add_argument("--generated", type=int, default=0,
                  help="loss on the last N tokens of each row only; also times the loss-positions-only LM head")
  ap.add_argument("--ppo", action="store_true",
                  help="also time RPR's joint PPO + value step (actor and critic: about twice an LM step's work)")
  ap.add_argument("overrides", nargs="*")
  args = ap.parse_args()

  from rsi_jax.config import load_config
  from rsi_jax.models.mesh import build_mesh

  devices = jax.devices()[:args.devices] if args.devices else jax.devices()
  cfg = load_config(None, ["mesh.ici_fsdp_parallelism=-1", f"model.max_target_length={args.seq}"]
                    + list(args.overrides))
  mesh = build_mesh(cfg, devices)
  b = args.batch or len(devices)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, cfg.model.vocab_size, (b, args.seq)).astype(np.int32)
  positions = np.broadcast_to(np.arange(args.seq, dtype=np.int32), (b, args.seq)).copy()
  segs = np.ones((b, args.seq), np.int32)
  n_tok = b * args.seq
  print(f"# {cfg.model.name}: {jax.devices()[0].platform} x{len(devices)}, batch {b} x seq {args.seq}, "
        f"dtype {cfg.model.dtype}, remat {cfg.model.remat_policy}, attention {cfg.model.attention}")

  t_mt, mt = maxtext(cfg, mesh, tokens, positions, segs, args.steps)
  rows = [("maxtext pre-train step", t_mt)]
  rows.append((f"ours (logits {cfg.model.logits_dtype})", ours(cfg, mesh, tokens, positions, segs, args.steps)))
  if args.generated:
    rows[-1] = (f"ours, loss on last {args.generated}", ours(cfg, mesh, tokens, positions, segs, args.steps,
                                                          generated=args.generated))
    rows.append((f"ours, LM head on last {args.generated}", ours(cfg, mesh, tokens, positions, segs, args.steps,
                                                              generated=args.generated, index=True)))
  if args.ppo:
    rows.append(("ours, joint PPO + value step", ppo(cfg, mesh, tokens, positions, segs, args.steps,
                                                    args.generated)))
  if args.also_bf16_logits:
    rows.append(("ours (logits bfloat16)", ours(cfg, mesh, tokens, positions, segs, args.steps, "bfloat16")))

  from maxtext.utils import maxtext_utils
  try:
    tflops_dev, _, _ = maxtext_utils.calculate_tflops_training_per_device(mt, log=False)
  except Exception:  # FLOP count is informative only
    tflops_dev = float("nan")
  gpu = jax.devices()[0].platform == "gpu"
  for name, dt in rows:
    line = f"{name:28s} step {dt * 1e3:9.1f} ms  {n_tok / dt:12.0f} tok/s  ratio vs maxtext {t_mt / dt:5.3f}"
    if gpu:  # the joint PPO step runs two backbones (actor and critic): about twice the LM step's FLOPs
      work = 2 if "PPO" in name else 1
      line += f"  MFU {work * tflops_dev / dt / args.peak_tflops:6.1%}"
    print(line)


if __name__ == "__main__":
  main()
