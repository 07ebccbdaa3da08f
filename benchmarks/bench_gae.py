"""TB-GAE speed: reverse lax.scan vs the associative-scan variant vs rlax's GAE (vmapped), side by side.

  python benchmarks/bench_gae.py                 # (256, 8192) and (1, 262144), default backend
  python benchmarks/bench_gae.py --reps 20 --shapes 256x8192

Rows are packed like rollouts: ~70% generated tokens, a turn boundary every ~100 tokens, rare terminations,
sparse rewards. rlax gets the same rows as plain token-clock GAE (discount γ(1 − d), no observation skipping,
no turn clock): it is the floor for "one reverse scan over the token axis", not the same estimator. Its
inputs (discounts, the T+1 value column) are built outside the timed call. Each figure is the minimum over
--reps timed calls after one warm-up call; compile time is reported separately.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


def make_rows(batch, length, seed=0):
  rng = np.random.default_rng(seed)
  gen = rng.random((batch, length)) < 0.7
  turns = np.cumsum(rng.random((batch, length)) < 0.01, axis=1).astype(np.int32)
  dones = gen & (rng.random((batch, length)) < 2e-4)
  values = rng.normal(size=(batch, length)).astype(np.float32)
  rewards = np.where(gen & (rng.random((batch, length)) < 0.01), rng.normal(size=(batch, length)), 0.0)
  return tuple(jnp.asarray(x) for x in (values, rewards.astype(np.float32), turns, gen, dones))


def timed(fn, args, reps):
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  out = jax.block_until_ready(compiled(*args))  # warm-up
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
  return out, compile_s, min(times), statistics.median(times)


def main(argv=None):
  from rsi_jax.rl import tb_gae, tb_gae_associative

  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--shapes", default="256x8192,1x262144", help="comma-separated BxT")
  p.add_argument("--reps", type=int, default=5)
  p.add_argument("--gamma", type=float, default=0.99)
  p.add_argument("--lam", type=float, default=0.95)
  p.add_argument("--no-rlax", action="store_true", help="skip rlax (e.g. where it is not installed)")
  args = p.parse_args(argv)

  rlax = None
  if not args.no_rlax:
    try:
      import rlax
    except ImportError:
      print("rlax not importable: its column is skipped")
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}")
  g, lam = args.gamma, args.lam
  for shape in args.shapes.split(","):
    batch, length = (int(x) for x in shape.lower().split("x"))
    rows = make_rows(batch, length)
    results = {}
    scan_out, *results["tb_gae (lax.scan)"] = timed(
        lambda *x: tb_gae(*x, g, lam).advantages, rows, args.reps)
    assoc_out, *results["tb_gae_associative"] = timed(
        lambda *x: tb_gae_associative(*x, g, lam).advantages, rows, args.reps)
    max_diff = float(jnp.max(jnp.abs(assoc_out - scan_out)))
    if rlax is not None:
      values, rewards, _, _, dones = rows
      disc = g * (1.0 - dones.astype(jnp.float32))
      v_ext = jnp.concatenate([values, jnp.zeros((batch, 1), jnp.float32)], axis=1)
      rlax_gae = jax.vmap(rlax.truncated_generalized_advantage_estimation, in_axes=(0, 0, None, 0))
      _, *results["rlax GAE (vmapped)"] = timed(lambda r, d, v: rlax_gae(r, d, lam, v),
                                                (rewards, disc, v_ext), args.reps)
    base = results["tb_gae (lax.scan)"][1]
    print(f"\n(B, T) = ({batch}, {length}), reps {args.reps}, max |assoc - scan| = {max_diff:.2e}")
    print(f"  {'implementation':<22} {'compile s':>9} {'min ms':>10} {'median ms':>10} {'÷ scan':>8}"
          + (f" {'÷ rlax':>8}" if rlax is not None else ""))
    for name, (compile_s, best, med) in results.items():
      line = f"  {name:<22} {compile_s:9.2f} {best * 1e3:10.2f} {med * 1e3:10.2f} {best / base:8.2f}"
      if rlax is not None:
        line += f" {best / results['rlax GAE (vmapped)'][1]:8.2f}"
      print(line)


if __name__ == "__main__":
  main()
