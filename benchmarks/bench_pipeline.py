"""RPR step throughput with one-batch-ahead rollouts (``rollout.max_staleness=1``) vs synchronous (``0``).

Runs the real training program (``rsi_jax.pipeline.driver.Driver``) on the smoke config for one RPR phase
of ``--steps`` rollout steps (joint PPO from the first, real Docker episodes), once per setting and
alternating for ``--repeats`` rounds in this one process, and reports trajectories per second over the steps
after the first (the first step includes compilation and cannot overlap anything). Prints the ratio, and how
many cores the machine kept busy (``/proc/stat``, every process: the sampler, Docker and the containers, the
learner), since overlapping rollouts with learning only helps where the synchronous steps leave cores idle.

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
  2026-12-02: 0.236 vs 0.290 traj/s: 1.23x (one round). Of a synchronous step's rollouts, the two upstream
    tasks' verifiers took 9.7 s each, 7.7 s of it their offline `apt-get update` retrying with back-off;
    with apt's retries off in offline verification (rsi_jax.env.verifier) they take 3 s, and the same day:
    0.365 vs 0.429 traj/s: 1.17x (median of 2 rounds; 0.370 vs 0.440, 1.19x, in another 2). The synchronous
    throughput itself rose 1.55x (0.236 -> 0.365). A synchronous step is now 6.4 s of rollouts and 3.8 s of
    learning, but neither leaves the 2 cores idle: 1.81 of 2 are busy over the synchronous steps (1.77 while
    waiting for rollouts, of which ~0.47 is the sampler's process and the rest Docker and the containers;
    1.91 while learning). The overlap has 0.19 idle cores to use, so 1.5x is out of reach on this machine
    whatever the two sides' lengths; it needs a learner that does not share the rollouts' CPUs (an
    accelerator), which is the setting the paper's one-batch-ahead design is for.
"""

from __future__ import annotations

import argparse
import bisect
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from rsi_jax.config import load_config
from rsi_jax.pipeline.console import Console
from rsi_jax.pipeline.driver import Driver

REPO = Path(__file__).resolve().parents[1]


class CpuMeter:
  """The machine's busy CPU time (``/proc/stat``: every process, Docker's and the containers' included),
  sampled every 0.2 s; :meth:`cores` gives the mean number of busy cores over a wall-clock interval. None
  where ``/proc/stat`` is missing (not Linux)."""

  def __init__(self):
    self.samples, self._stop = [], threading.Event()
    if Path("/proc/stat").exists():
      threading.Thread(target=self._run, daemon=True).start()

  @staticmethod
  def _read():
    with open("/proc/stat") as f:
      v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait, seconds

  def _run(self):
    while not self._stop.is_set():
      self.samples.append((time.time(), self._read()))
      time.sleep(0.2)

  def stop(self):
    self._stop.set()

  def cores(self, a: float, z: float) -> float | None:
    ts = [t for t, _ in self.samples]
    i, j = bisect.bisect_left(ts, a), bisect.bisect_right(ts, z) - 1
    if j <= i:  # (no samples: not Linux)
      return None
    (t0, b0), (t1, b1) = self.samples[i], self.samples[j]
    return (b1 - b0) / (t1 - t0)


def _mean(xs):
  xs = [x for x in xs if x is not None]
  return sum(xs) / len(xs) if xs else None


def run_once(staleness: int, steps: int, extra: list[str], out: str, name: str) -> dict:
  ov = [f"run.output_dir={out}", f"run.name={name}", "run.progress=false", "pipeline.phases=[rpr1]",
        f"pipeline.rollout_steps={steps}", "pipeline.critic_only_steps=0", f"pipeline.checkpoint_every={steps}",
        f"rollout.max_staleness={staleness}", *extra]
  cfg = load_config(REPO / "configs" / "smoke.yml", ov)
  used, spans = [], []
  meter = CpuMeter()

  def on_step(phase, step, m):
    used.append(m["episodes"])
    now = time.time()  # this step: waiting for its rollouts, then learning
    spans.append((now - m["step_seconds"], now - m["step_seconds"] + m["rollout_wait_seconds"], now))

  class Quiet(Console):
    def line(self, text):
      pass

  try:
    Driver(cfg, ov, console=Quiet(progress=False), on_step=on_step).run()
  finally:
    meter.stop()
  dt = spans[-1][2] - spans[0][2]
  return {"trajectories_per_s": sum(used[1:]) / dt, "seconds": dt, "steps": len(spans) - 1,
          "cores": meter.cores(spans[1][0], spans[-1][2]),
          "cores_waiting": _mean(meter.cores(a, b) for a, b, _ in spans[1:] if b - a > 0.5),
          "cores_learning": _mean(meter.cores(b, z) for _, b, z in spans[1:] if z - b > 0.5)}


def _cores(x) -> str:
  return "n/a" if x is None else f"{x:.2f}"


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--repeats", type=int, default=1)
  args, extra = ap.parse_known_args()
  res = {0: [], 1: []}  # max_staleness -> run_once's results, one per round
  with tempfile.TemporaryDirectory() as out:
    for r in range(args.repeats):
      for s in (0, 1) if r % 2 == 0 else (1, 0):
        x = run_once(s, args.steps, extra, out, f"s{s}-{r}")
        res[s].append(x)
        print(f"round {r} max_staleness={s}: {x['trajectories_per_s']:.3f} trajectories/s over {x['steps']} "
              f"steps ({x['seconds']:.1f}s); busy cores {_cores(x['cores'])} of {os.cpu_count()} (waiting "
              f"for rollouts {_cores(x['cores_waiting'])}, learning {_cores(x['cores_learning'])})", flush=True)
  sync, ahead = (statistics.median(x["trajectories_per_s"] for x in res[s]) for s in (0, 1))
  print(f"\nRPR step throughput (smoke config, {args.steps - 1} steps after the first, median of "
        f"{args.repeats}): synchronous {sync:.3f} traj/s, one batch ahead {ahead:.3f} traj/s -> "
        f"{ahead / sync:.2f}x")
  busy = _mean(x["cores"] for x in res[0])
  if busy is not None:  # overlap only helps where the synchronous steps leave cores idle
    print(f"The synchronous steps kept {busy:.2f} of {os.cpu_count()} cores busy (rollouts: the sampler, Docker "
          f"and the containers; learning: the update): {os.cpu_count() - busy:.2f} idle for the overlap to use")


if __name__ == "__main__":
  main()
