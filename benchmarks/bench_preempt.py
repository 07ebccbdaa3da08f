"""SIGTERM-to-exit latency of the training program at smoke size, at random moments.

Starts ``python -m rsi_jax.train`` (the smoke config, rsr1 then rpr1, deterministic rollouts) on one run
folder again and again; each attempt resumes what the previous one left and gets SIGTERM at a random moment
after its first step line (uniform over ``--window`` seconds: inside RSR's funnel or SFT, an RPR step's
rollouts or update, a checkpoint write, a phase boundary). Prints, per attempt, the seconds from the signal to
the process's exit, its exit status and the last console line before the signal; then p50 / p95 / max against
the budget a preemption notice gives (``--budget``, 25 s). An attempt that finishes the run starts a new run
folder. Reference measured in the same run: the process's own start-up to its first step line (what a resume
costs anyway).

Usage: .venv/bin/python benchmarks/bench_preempt.py [--moments 10] [--window 40] [--seed 0] [key=value ...]
Needs a Docker daemon and rsi-base (scripts/docker_up.sh, scripts/build_base_image.sh).

Measured on the 2-core CPU (2026-12-02, seed 0): 10 moments (2 in RSR-1's SFT, 8 in RPR-1: rollouts, updates,
checkpoint writes), exit status 0 in 10/10, SIGTERM -> exit p50 6.3 s, p95 14.3 s, max 14.3 s: 0.57x the 25 s
budget. The slowest were updates under way when the notice came (a resumed process compiles its first joint
step again, ~10 s on this machine): an update finishes before the step's checkpoint. Reference in the same run:
a resume's start-up to its first console line, median 6.1 s.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARGS = ["--config=configs/smoke.yml", "pipeline.phases=[rsr1, rpr1]", "rollout.deterministic=true",
        "rollout.max_staleness=0",
        "run.progress=false", "mesh.ici_fsdp_parallelism=2", "mesh.ici_tensor_parallelism=2",
        "env.max_tasks=4", "pipeline.rollout_steps=6", "pipeline.critic_only_steps=1", "pipeline.checkpoint_every=2"]
STEP = re.compile(r"^\[(\w+) (\d+)/(\d+)\]")


def attempt(out: str, name: str, delay: float, extra) -> dict:
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
             PYTHONUNBUFFERED="1")
  t0 = time.time()
  p = subprocess.Popen([sys.executable, "-m", "rsi_jax.train", *ARGS, f"run.output_dir={out}", f"run.name={name}",
                        *extra], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  lines, first = [], threading.Event()
  t_first = [None]

  def read():
    for line in p.stdout:
      lines.append(line.rstrip("\n"))
      if t_first[0] is None and (STEP.match(line) or line.startswith("[")):
        t_first[0] = time.time()
        first.set()
  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  while not first.wait(0.1):
    if p.poll() is not None:
      reader.join()
      raise SystemExit(f"run {name} ended (rc {p.returncode}) before its first line:\n" + "\n".join(lines[-20:]))
  end = time.time() + delay
  while time.time() < end and p.poll() is None:
    time.sleep(0.05)
  if p.poll() is not None:
    reader.join()
    return {"finished": True, "lines": lines}
  before = lines[-1] if lines else ""
  t_sig = time.time()
  p.send_signal(signal.SIGTERM)
  p.wait()
  latency = time.time() - t_sig
  reader.join()
  return {"finished": False, "latency": latency, "rc": p.returncode, "before": before,
          "startup": t_first[0] - t0, "said": next((x for x in lines if x.startswith("preempted")), lines[-1:])}


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--moments", type=int, default=10)
  ap.add_argument("--window", type=float, default=40.0)
  ap.add_argument("--budget", type=float, default=25.0)
  ap.add_argument("--seed", type=int, default=0)
  a, extra = ap.parse_known_args()
  rng = random.Random(a.seed)
  out = tempfile.mkdtemp(prefix="bench-preempt-")
  run, got = 0, []
  while len(got) < a.moments:
    r = attempt(out, f"p{run}", rng.uniform(0.0, a.window), extra)
    if r["finished"]:
      run += 1
      continue
    got.append(r)
    print(f"{len(got):2d}  {r['latency']:6.2f} s  rc {r['rc']}  start-up {r['startup']:5.1f} s  after: "
          f"{r['before'][:70]!r}  said: {str(r['said'])[:90]!r}", flush=True)
  lat = sorted(x["latency"] for x in got)
  p50 = statistics.median(lat)
  p95 = lat[min(len(lat) - 1, round(0.95 * (len(lat) - 1)))]
  startup = statistics.median(x["startup"] for x in got)
  print(f"SIGTERM -> exit over {len(lat)} random moments: p50 {p50:.2f} s, p95 {p95:.2f} s, max {lat[-1]:.2f} s; "
        f"budget {a.budget:.0f} s: p95 is {p95 / a.budget:.2f}x the budget; exit status 0 in "
        f"{sum(x['rc'] == 0 for x in got)}/{len(got)}")
  print(f"reference, same run: start-up to the first console line (what each resume costs) median {startup:.1f} s; "
        f"p50 latency is {p50 / startup:.2f}x that")


if __name__ == "__main__":
  main()
