"""TB-GAE speed against rlax's GAE (vmapped) on the same rows, measured in the same run.

  python benchmarks/bench_gae.py                      # the pipeline's call, then the row kernels
  python benchmarks/bench_gae.py --pipeline 256x8192 --shapes none --reps 21

1. The pipeline's call (``rsi_jax.pipeline.rpr.linked_tb_gae``, what ``RPRTrainer`` runs, ``scan`` and
   ``associative``) on a rollout-like batch built by ``assemble_batch``: one row per segment, episodes of 1–4
   segments linked by ``next_row`` (summarization), prompts and summary prompts, turns of generated tokens
   between observations, padding, the terminal reward on each episode's last generated token, a few masked
   (infrastructure-failure) episodes. Beside it the former path (``tb_gae`` passes, one per link, with the
   longest chain's link count compiled in) and the host side of both: ``to_device_batch``, which now also
   settles the turn clock (``clock_flags``), and, formerly, ``chain_links``.
2. The row kernels ``tb_gae`` (lax.scan) and ``tb_gae_associative`` on synthetic packed rows (~70% generated
   tokens, a turn boundary every ~100 tokens, rare terminations, sparse rewards).

rlax gets the same rows as plain token-clock GAE (discount γ(1 − d), no observation skipping, no turn clock,
no links): the floor for "one reverse scan over the token axis", not the same estimator. Its inputs
(discounts, the T+1 value column) are built outside the timed call, like the pipeline's host arrays. Each
figure is the minimum over --reps timed calls after one warm-up call, the entries of a table timed in turn
(so load from other processes hits each alike); compile time is reported separately.
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


def rollout_batch(rows, length, seed=0):
  """A TrajectoryBatch like a rollout step's: ``rows`` segments of at most ``length`` tokens."""
  from rsi_jax.rl.batch import Sample, assemble_batch

  rng = np.random.default_rng(seed)
  episodes, n = [], 0
  while n < rows:
    k = min(int(rng.choice([1, 2, 3, 4], p=[0.55, 0.25, 0.12, 0.08])), rows - n)
    turn, segs = 0, []
    for s in range(k):
      size = int(rng.integers(length // 4, length + 1)) if s < k - 1 else int(rng.integers(512, length + 1))
      gen = np.zeros(size, bool)
      turns = np.full(size, turn, np.int32)
      pos = int(rng.integers(200, 1500)) if s == 0 else int(rng.integers(150, 600))  # prompt / summary
      while pos < size:
        g = min(int(rng.geometric(1 / 120)), size - pos)
        gen[pos:pos + g] = True
        turns[pos:] = turn
        pos += g + int(rng.geometric(1 / 60))  # the observation after the call
        turn += 1
      segs.append(Sample(rng.integers(0, 50_000, size), gen, np.zeros(size, np.float32), turns, len(episodes)))
    episodes.append(segs)
    n += k
  rewards = rng.normal(size=len(episodes))
  ok = rng.random(len(episodes)) > 0.03
  return assemble_batch(episodes, rewards, ok, pad_multiple=2048, num_rows=rows)


def old_linked_tb_gae(values, batch, gamma_turn, lambda_turn, links):
  """The former pipeline call: a TB-GAE pass, then one more per link, each handing every row the carry of its
  continuation's first generated token (``links`` static: one compile per link count)."""
  from rsi_jax.rl.advantages import TBGAECarry, tb_gae

  gen = batch["gen_mask"]
  res = tb_gae(values, batch["rewards"], batch["turn_ids"], gen, batch["dones"], gamma_turn, lambda_turn)
  nxt = batch["next_row"]
  has_next = nxt >= 0
  nxt_c = jnp.where(has_next, nxt, 0)
  next_gen = gen[nxt_c].sum(-1) > 0
  first = jnp.argmax(gen > 0, axis=1)
  take = lambda a: a[nxt_c, first[nxt_c]]
  inherit = has_next & ~next_gen
  carry = None
  for _ in range(links):
    own = TBGAECarry(value=take(values).astype(jnp.float32), advantage=take(res.advantages),
                     turn_id=take(batch["turn_ids"]).astype(jnp.int32), present=has_next & next_gen)
    if carry is not None:
      own = jax.tree.map(lambda o, c: jnp.where(inherit, c[nxt_c], o), own, carry)
    carry = own
    res = tb_gae(values, batch["rewards"], batch["turn_ids"], gen, batch["dones"], gamma_turn, lambda_turn,
                 carry=carry)
  return res


def compiled(fn, args):
  t0 = time.perf_counter()
  c = jax.jit(fn).lower(*args).compile()
  return c, time.perf_counter() - t0


_CLOCK = time.perf_counter  # --cpu-time: time.process_time


def race(entries, reps):
  """{name: (compiled fn, args)} timed round-robin (so load changes hit every entry alike): min and median."""
  outs = {k: jax.block_until_ready(fn(*args)) for k, (fn, args) in entries.items()}  # warm-up
  times = {k: [] for k in entries}
  for _ in range(reps):
    for k, (fn, args) in entries.items():
      t0 = _CLOCK()
      jax.block_until_ready(fn(*args))
      times[k].append(_CLOCK() - t0)
  return outs, {k: (min(v), statistics.median(v)) for k, v in times.items()}


def host_time(fn, reps):
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return min(times)


def rlax_entry(rlax, values, rewards, dones, gamma, lam):
  b = values.shape[0]
  disc = gamma * (1.0 - jnp.asarray(dones, jnp.float32))
  v_ext = jnp.concatenate([jnp.asarray(values), jnp.zeros((b, 1), jnp.float32)], axis=1)
  rlax_gae = jax.vmap(rlax.truncated_generalized_advantage_estimation, in_axes=(0, 0, None, 0))
  args = (jnp.asarray(rewards, jnp.float32), disc, v_ext)
  return compiled(lambda r, d, v: rlax_gae(r, d, lam, v), args), args


def print_table(results, compile_s, base, extra=None):
  print(f"  {'call':<34} {'compile s':>9} {'min ms':>9} {'median ms':>10} {'÷ rlax':>7}")
  for name, (best, med) in results.items():
    print(f"  {name:<34} {compile_s[name]:9.2f} {best * 1e3:9.2f} {med * 1e3:10.2f} {best / base:7.2f}")
  for line in extra or ():
    print(line)


def bench_pipeline(shape, reps, gamma, lam, rlax):
  from rsi_jax.pipeline.rpr import _SAMPLE_FIELDS, chain_links, linked_tb_gae, to_device_batch
  from rsi_jax.rl.linked_gae import clock_flags

  rows, length = (int(x) for x in shape.lower().split("x"))
  batch = rollout_batch(rows, length)
  links = chain_links(batch)
  values = jnp.asarray(np.random.default_rng(1).normal(size=batch.gen_mask.shape).astype(np.float32))
  dev = to_device_batch(batch)
  old_dev = {k: dev[k] for k in _SAMPLE_FIELDS}
  entries, compile_s = {}, {}
  for impl in ("scan", "associative"):
    name = f"linked_tb_gae {impl}"
    fn, compile_s[name] = compiled(lambda v, b, impl=impl: linked_tb_gae(v, b, gamma, lam, impl=impl)[:2],
                                   (values, dev))
    entries[name] = (fn, (values, dev))
  name = f"former: {links + 1} tb_gae passes"
  fn, compile_s[name] = compiled(lambda v, b: old_linked_tb_gae(v, b, gamma, lam, links)[:2], (values, old_dev))
  entries[name] = (fn, (values, old_dev))
  if rlax is not None:
    (fn, compile_s["rlax GAE (vmapped)"]), args = rlax_entry(rlax, values, batch.rewards, batch.dones, gamma, lam)
    entries["rlax GAE (vmapped)"] = (fn, args)
  outs, results = race(entries, reps)
  ref = outs[f"former: {links + 1} tb_gae passes"][0]
  diffs = {k: float(jnp.max(jnp.abs(outs[k][0] - ref))) for k in entries if k.startswith("linked")}
  host_new = host_time(lambda: to_device_batch(batch), reps)
  host_old = host_time(lambda: ({k: jnp.asarray(getattr(batch, k)) for k in _SAMPLE_FIELDS}, chain_links(batch)),
                       reps)
  host_clock = host_time(lambda: clock_flags(batch.gen_mask, batch.turn_ids, batch.dones, batch.next_row), reps)
  gen = batch.gen_mask > 0
  print(f"\npipeline call, rollout-like batch ({rows}, {batch.gen_mask.shape[1]}): {int((batch.next_row >= 0).sum())}"
        f" links, longest episode {links + 1} segments, {gen.mean():.0%} generated tokens, reps {reps}; "
        f"max |new - former| = {max(diffs.values()):.2e}")
  base = results["rlax GAE (vmapped)"][0] if rlax is not None else results["linked_tb_gae scan"][0]
  extra = [f"  host: clock_flags {host_clock * 1e3:.2f} ms, to_device_batch {host_new * 1e3:.2f} ms (with it), "
           f"former to_device_batch + chain_links {host_old * 1e3:.2f} ms"]
  if rlax is not None:
    scan = results["linked_tb_gae scan"][0]
    extra.append(f"  linked_tb_gae scan ÷ rlax: {scan / base:.2f} (device), "
                 f"{(scan + host_clock) / base:.2f} (with the host's clock_flags)")
  print_table(results, compile_s, base, extra)


def bench_rows(shape, reps, gamma, lam, rlax):
  from rsi_jax.rl import tb_gae, tb_gae_associative

  batch, length = (int(x) for x in shape.lower().split("x"))
  rows = make_rows(batch, length)
  entries, compile_s = {}, {}
  for name, f in (("tb_gae (lax.scan)", tb_gae), ("tb_gae_associative", tb_gae_associative)):
    fn, compile_s[name] = compiled(lambda *x, f=f: f(*x, gamma, lam).advantages, rows)
    entries[name] = (fn, rows)
  if rlax is not None:
    values, rewards, _, _, dones = rows
    (fn, compile_s["rlax GAE (vmapped)"]), args = rlax_entry(rlax, values, rewards, dones, gamma, lam)
    entries["rlax GAE (vmapped)"] = (fn, args)
  outs, results = race(entries, reps)
  max_diff = float(jnp.max(jnp.abs(outs["tb_gae_associative"] - outs["tb_gae (lax.scan)"])))
  print(f"\nrow kernels (B, T) = ({batch}, {length}), reps {reps}, max |assoc - scan| = {max_diff:.2e}")
  base = results["rlax GAE (vmapped)"][0] if rlax is not None else results["tb_gae (lax.scan)"][0]
  print_table(results, compile_s, base)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--pipeline", default="256x8192", help="rows x max tokens of the rollout-like batch; none: skip")
  p.add_argument("--shapes", default="256x8192,1x262144", help="comma-separated BxT of the row kernels; none: skip")
  p.add_argument("--reps", type=int, default=11)
  p.add_argument("--gamma", type=float, default=0.99)
  p.add_argument("--lam", type=float, default=0.95)
  p.add_argument("--no-rlax", action="store_true", help="skip rlax (e.g. where it is not installed)")
  p.add_argument("--cpu-time", action="store_true",
                 help="time the process's CPU seconds, not wall time (steadier on a machine others load)")
  args = p.parse_args(argv)
  global _CLOCK
  _CLOCK = time.process_time if args.cpu_time else time.perf_counter

  rlax = None
  if not args.no_rlax:
    try:
      import rlax
    except ImportError:
      print("rlax not importable: its column is skipped")
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}")
  if args.pipeline != "none":
    bench_pipeline(args.pipeline, args.reps, args.gamma, args.lam, rlax)
  if args.shapes != "none":
    for shape in args.shapes.split(","):
      bench_rows(shape, args.reps, args.gamma, args.lam, rlax)


if __name__ == "__main__":
  main()
