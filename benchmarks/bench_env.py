"""Environment throughput: task image build time per family (fresh vs cached), episodes per minute for N
concurrent oracle episodes vs the same N run one after another, container start latency, and per-command
latency of the persistent shell.

Usage: .venv/bin/python benchmarks/bench_env.py [--episodes 16] [--concurrency 16] [--tasks-dir tasks]
Needs a Docker daemon and rsi-base (scripts/docker_up.sh, scripts/build_base_image.sh).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from pathlib import Path

from rsi_jax.env.episode import EnvSettings
from rsi_jax.env.harness import OracleHarness
from rsi_jax.env.pool import EnvPool
from rsi_jax.env.reaper import reap_containers
from rsi_jax.env.sandbox import DockerSandbox, docker_client
from rsi_jax.env.tasks import load_tasks

REPO = Path(__file__).resolve().parents[1]


def _pct(xs, q):
  xs = sorted(xs)
  return xs[min(len(xs) - 1, int(q * len(xs)))]


def bench_start(client, run_id, n):
  """Container start latency (create + start) and the first command's latency after it."""
  starts, firsts, cmds = [], [], []
  for _ in range(n):
    b = DockerSandbox(client, "rsi-base", run_id=run_id, task_name="bench-start")
    t0 = time.perf_counter()
    with b:
      t1 = time.perf_counter()
      b.run("true")
      t2 = time.perf_counter()
      for _ in range(3):
        t = time.perf_counter()
        b.run("echo hi")
        cmds.append(time.perf_counter() - t)
    starts.append(t1 - t0)
    firsts.append(t2 - t1)
  return starts, firsts, cmds


def bench_disk_checks(client, run_id, n):
  """Per-command latency (``true``) of one container, side by side: no storage limit, the limit measured by the
  daemon (``docker ps --size``, as before the writable layer was read here), and measured here (the changed
  files only) -- after the command has written a few hundred small files."""
  out = {}
  with DockerSandbox(client, "rsi-base", run_id=run_id, task_name="bench-disk", disk_limit_bytes=1 << 30) as b:
    b.run("mkdir -p /tmp/f && for i in $(seq 300); do echo $i > /tmp/f/$i; done")
    upper = b._upper
    for name, limit, where in (("no limit", None, None), ("daemon size", 1 << 30, None),
                               ("measured here", 1 << 30, upper)):
      b.disk_limit_bytes, b._upper = limit, where
      ts = []
      for _ in range(n):
        t = time.perf_counter()
        b.run("true")
        ts.append(time.perf_counter() - t)
      out[name] = statistics.median(ts)
  return out


def bench_builds(client, tasks, settings):
  """Per task family (its first task): a fresh build (its image and the layers only it uses removed first)
  and a cached one (the image is there: the content-hash tag is found). Builds as the run does: with
  ``settings.build_network`` (then also fetching what the verifier fetches at test time)."""
  from rsi_jax.env.images import build_task_image, task_image_tag
  rows = []
  net, ca = settings.build_network, settings.build_ca_bundle if settings.build_network != "none" else None
  for fam in sorted({t.family for t in tasks}):
    t = next(x for x in tasks if x.family == fam)
    tag, _, _ = task_image_tag(client, t, settings.image_map, ca, verifier_deps=net != "none")
    try:
      client.images.remove(tag)
    except Exception:  # noqa: BLE001 - not built yet
      pass
    t0 = time.perf_counter()
    build_task_image(client, t, settings.image_map, network=net, ca_bundle=ca)
    fresh = time.perf_counter() - t0
    t0 = time.perf_counter()
    build_task_image(client, t, settings.image_map, network=net, ca_bundle=ca)
    rows.append((fam, t.name, fresh, time.perf_counter() - t0))
  return rows


def bench_episodes(settings, tasks, n, concurrency):
  jobs = [(tasks[i % len(tasks)], OracleHarness()) for i in range(n)]
  with EnvPool(settings, concurrency=concurrency, reap=False) as pool:
    t0 = time.perf_counter()
    res = pool.run(jobs)
    dt = time.perf_counter() - t0
  ok = sum(r.success == 1 for r in res)
  return dt, ok, res


def bench_diff_modes(settings, tasks, n, concurrency) -> dict:
  """The same episodes with the verifier's change list from the daemon (``docker diff``, as before the layers
  were read here) and from the container's layers read on this host (:mod:`rsi_jax.env.overlay`)."""
  import rsi_jax.env.sandbox as sandbox
  read_here = sandbox.local_layers
  out = {}
  try:
    for name, find in (("daemon", lambda client, container: None), ("here", read_here)):
      sandbox.local_layers = find  # None: no readable layers, so the sandbox asks the daemon
      out[name] = bench_episodes(settings, tasks, n, concurrency)[0]
  finally:
    sandbox.local_layers = read_here
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--episodes", type=int, default=16)
  ap.add_argument("--concurrency", type=int, default=16)
  ap.add_argument("--starts", type=int, default=10)
  ap.add_argument("--tasks-dir", default=str(REPO / "tasks"))
  args = ap.parse_args()

  client = docker_client()
  run_id = f"bench-{uuid.uuid4().hex[:8]}"
  settings = EnvSettings(run_id=run_id)
  tasks = load_tasks(args.tasks_dir)
  try:
    starts, firsts, cmds = bench_start(client, run_id, args.starts)
    print(f"container start (create+start): median {statistics.median(starts) * 1e3:.0f} ms, "
          f"p90 {_pct(starts, 0.9) * 1e3:.0f} ms over {len(starts)}")
    print(f"first command after start:     median {statistics.median(firsts) * 1e3:.0f} ms")
    print(f"command latency (echo):        median {statistics.median(cmds) * 1e3:.0f} ms, "
          f"p90 {_pct(cmds, 0.9) * 1e3:.0f} ms over {len(cmds)}")

    checks = bench_disk_checks(client, run_id, 3 * args.starts)
    base = checks["no limit"]
    print("command latency (true) by storage-limit check: " + ", ".join(
        f"{k} {v * 1e3:.0f} ms (+{(v - base) * 1e3:.0f})" for k, v in checks.items()))

    for fam, name, fresh, cached in bench_builds(client, tasks, settings):
      print(f"image build {fam:<18} ({name}): fresh {fresh:5.2f} s, cached {cached * 1e3:6.1f} ms, "
            f"ratio {fresh / cached:,.0f}x")
    with EnvPool(settings, concurrency=8, reap=False) as pool:  # image builds are not what is measured
      t0 = time.perf_counter()
      pool.prebuild(tasks)
      print(f"prebuild of {len(tasks)} task images: {time.perf_counter() - t0:.1f} s")

    seq_dt, seq_ok, _ = bench_episodes(settings, tasks, args.episodes, 1)
    con_dt, con_ok, res = bench_episodes(settings, tasks, args.episodes, args.concurrency)
    seq_rate, con_rate = 60 * args.episodes / seq_dt, 60 * args.episodes / con_dt
    print(f"sequential:    {args.episodes} oracle episodes in {seq_dt:6.1f} s = {seq_rate:6.1f} episodes/min "
          f"({seq_ok}/{args.episodes} passed)")
    print(f"concurrent x{args.concurrency}: {args.episodes} oracle episodes in {con_dt:6.1f} s = "
          f"{con_rate:6.1f} episodes/min ({con_ok}/{args.episodes} passed)")
    print(f"speed-up concurrent / sequential: {con_rate / seq_rate:.2f}x")
    phase = {k: statistics.median(getattr(r, k) for r in res) for k in ("start_s", "agent_s", "verify_s", "total_s")}
    print("concurrent episode phases (median s): " + ", ".join(f"{k[:-2]} {v:.2f}" for k, v in phase.items()))
    for conc in (1, args.concurrency):
      dts = bench_diff_modes(settings, tasks, args.episodes, conc)
      print(f"verifier's tamper check x{conc}: {args.episodes} oracle episodes in {dts['daemon']:6.1f} s with the "
            f"daemon's docker diff, {dts['here']:6.1f} s with the layers read here: "
            f"{dts['daemon'] / dts['here']:.2f}x")
  finally:
    reap_containers(client, run_id)


if __name__ == "__main__":
  main()
