"""RPR step throughput with one-batch-ahead rollouts (``rollout.max_staleness=1``) vs synchronous (``0``).

Runs the real training program (``rsi_jax.pipeline.driver.Driver``) on the smoke config for one RPR phase
of ``--steps`` rollout steps (joint PPO from the first, real Docker episodes), once per setting and
alternating for ``--repeats`` rounds in this one process, and reports trajectories per second over the steps
after the first (the first step includes compilation and cannot overlap anything). Prints the ratio.

Usage: XLA_FLAGS=--xla_force_host_platform_device_count=4 .venv/bin/python benchmarks/bench_pipeline.py
       [--steps 5] [--repeats 1] [key=value ...]
Needs a Docker daemon and rsi-base (scripts/docker_up.sh, scripts/build_base_image.sh).

Measured on the 2-core CPU (smoke config, median of 2 rounds):
  2026-11-30: synchronous 0.301, one batch ahead 0.338 traj/s: 1.12x (the learner's update, ~12 s, was
    mostly the LM head over every position; the rollouts ~5 s).
  2026-12-01, LM head at the loss positions only, paged sampler: 0.201 vs 0.246 traj/s: 1.22x (earlier runs
    the same day, slot sampler: 0.205 vs 0.268, 1.31x). A synchronous run's steps 2-5 now take 16.7 s of
    rollouts (Docker episodes: containers, commands, verifiers) and 2.8 s of learning, so overlapping them can
    give at most (16.7 + 2.8) / 16.7 = 1.17x here: the ratio is bounded by the smaller side, not the overlap.
  2026-12-02: 0.236 vs 0.290 traj/s: 1.23x (one round).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rsi_jax.config import load_config
from rsi_jax.pipeline.driver import Console, Driver

REPO = Path(__file__).resolve().parents[1]


def run_once(staleness: int, steps: int, extra: list[str], out: str, name: str) -> dict:
  ov = [f"run.output_dir={out}", f"run.name={name}", "run.progress=false", "pipeline.phases=[rpr1]",
        f"pipeline.rollout_steps={steps}", "pipeline.critic_only_steps=0", f"pipeline.checkpoint_every={steps}",
        f"rollout.max_staleness={staleness}", *extra]
  cfg = load_config(REPO / "configs" / "smoke.yml", ov)
  times, used = [], []

  def on_step(phase, step, m):
    times.append(time.perf_counter())
    used.append(m["episodes"])

  class Quiet(Console):
    def line(self, text):
      pass

  Driver(cfg, ov, console=Quiet(progress=False), on_step=on_step).run()
  dt = times[-1] - times[0]
  return {"trajectories_per_s": sum(used[1:]) / dt, "seconds": dt, "steps": len(times) - 1}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--repeats", type=int, default=1)
  args, extra = ap.parse_known_args()
  res = {0: [], 1: []}
  with tempfile.TemporaryDirectory() as out:
    for r in range(args.repeats):
      for s in (0, 1) if r % 2 == 0 else (1, 0):
        x = run_once(s, args.steps, extra, out, f"s{s}-{r}")
        res[s].append(x["trajectories_per_s"])
        print(f"round {r} max_staleness={s}: {x['trajectories_per_s']:.3f} trajectories/s over {x['steps']} "
              f"steps ({x['seconds']:.1f}s)", flush=True)
  sync, ahead = statistics.median(res[0]), statistics.median(res[1])
  print(f"\nRPR step throughput (smoke config, {args.steps - 1} steps after the first, median of "
        f"{args.repeats}): synchronous {sync:.3f} traj/s, one batch ahead {ahead:.3f} traj/s -> "
        f"{ahead / sync:.2f}x")


if __name__ == "__main__":
  main()
