"""Learner step with token-budget packing against one sample per row, same batch and mesh, one run.

    python benchmarks/bench_packing.py [--episodes N] [--median-len L] [--devices D] [--budget B]
        [--steps S] [key=value ...]

A rollout batch of ``--episodes`` single-segment episodes with long-tailed lengths (log-normal around
``--median-len``, as multi-turn terminal episodes are: a few long ones, many short), ~1/3 of each generated.
``RPRTrainer.step`` (π_old / v_old forward, TB-GAE, one joint PPO + value update) runs under three layouts:

* ``unpacked``: ``rl.per_device_token_budget=0``: one sample per row, every row padded to the longest;
* ``packed``: rows of at most ``--budget`` tokens per device and pass, gradients accumulated over passes;
* ``packed+balanced``: the same with ``rl.dynamic_balancing``.

Prints per layout: median step seconds, computed positions (passes x rows x T) and the share holding real
tokens, trained tokens/s, and the ratio of tokens/s against ``unpacked``. ``key=value`` are config overrides
(e.g. ``model_name=qwen3-0.6b``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--episodes", type=int, default=16)
  ap.add_argument("--median-len", type=int, default=384)
  ap.add_argument("--devices", type=int, default=1)
  ap.add_argument("--budget", type=int, default=2048)
  ap.add_argument("--pad", type=int, default=128)
  ap.add_argument("--steps", type=int, default=3)
  args, overrides = ap.parse_known_args()
  if args.devices > 1 and "jax" not in sys.modules:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.devices}")
  import jax
  import jax.numpy as jnp
  import numpy as np

  from rsi_jax.config import CONFIG_DIR, load_config, with_overrides
  from rsi_jax.models import Actor, Critic, build_mesh
  from rsi_jax.pipeline.rpr import RPRTrainer
  from rsi_jax.rl.batch import Sample, assemble_batch

  base = load_config(CONFIG_DIR / "smoke.yml", [f"mesh.ici_fsdp_parallelism={args.devices}",
                                                "mesh.ici_tensor_parallelism=1", f"rl.pad_multiple={args.pad}",
                                                *overrides])
  mesh = build_mesh(base, jax.devices()[:args.devices])
  actor, critic = Actor(base, mesh), Critic(base, mesh)
  a = actor.init(jax.random.key(0))
  c = critic.init_from_actor(a, jax.random.key(1))
  rng = np.random.default_rng(0)
  lens = np.clip(rng.lognormal(np.log(args.median_len), 0.8, args.episodes), 32, 4 * args.median_len).astype(int)
  eps = []
  for e, n in enumerate(lens):
    gen = np.zeros(n, bool)
    gen[n // 3:n // 3 + n // 6] = gen[n - n // 6:] = True  # two generated turns
    turns = np.where(np.arange(n) < n // 2, 0, 1)
    eps.append([Sample(rng.integers(0, 5000, n), gen, np.zeros(n, np.float32), turns, e)])
  batch = assemble_batch(eps, list(rng.normal(size=args.episodes)), pad_multiple=args.pad)
  trained = int(batch.gen_mask.sum())
  print(f"batch: {args.episodes} episodes, lengths {lens.min()}..{lens.max()} (median {int(np.median(lens))}), "
        f"{int(lens.sum())} tokens, {trained} generated; {args.devices} device(s); budget {args.budget}")
  layouts = {"unpacked": {"rl": {"per_device_token_budget": 0}},
             "packed": {"rl": {"per_device_token_budget": args.budget}},
             "packed+balanced": {"rl": {"per_device_token_budget": args.budget, "dynamic_balancing": True}}}
  results = {}
  for name, over in layouts.items():
    tr = RPRTrainer(with_overrides(base, over), actor, critic)
    state = tr.start_actor(tr.init_state(jax.tree.map(jnp.copy, a), jax.tree.map(jnp.copy, c), False))
    state, m = tr.step(state, batch, train_actor=True)  # compile
    times = []
    for _ in range(args.steps):
      t = time.perf_counter()
      state, m = tr.step(state, batch, train_actor=True)
      jax.block_until_ready(state.actor)
      times.append(time.perf_counter() - t)
    dt = float(np.median(times))
    computed = int(round(lens.sum() / m["packing/efficiency"]))  # passes x rows x T
    results[name] = (dt, m, computed)
  ref = trained / results["unpacked"][0]
  for name, (dt, m, computed) in results.items():
    print(f"{name:16s} {dt:7.2f} s/step  passes {m['packing/passes']:2d}  T {m['packing/row_length']:5d}  "
          f"computed {computed:6d} positions, {100 * m['packing/efficiency']:5.1f}% real  "
          f"shard imbalance {m['packing/shard_imbalance']:.2f}  {trained / dt:8.0f} trained tok/s  "
          f"ratio {trained / dt / ref:.2f}x")


if __name__ == "__main__":
  main()
