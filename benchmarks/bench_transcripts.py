"""Episode transcripts: bytes per episode, and what keeping them costs a rollout step (transcripts on vs off).

  python benchmarks/bench_transcripts.py                    # smoke-like and pod-like episodes
  python benchmarks/bench_transcripts.py --episodes 256 --steps 5 --run runs/smoke   # + a real run's files

1. Bytes per episode: the gzip JSON-lines record (:func:`rsi_jax.env.transcripts.episode_record`, as a step
   file holds it) of synthetic episodes shaped like the smoke run's (2 turns, 16-token replies, short outputs)
   and like a pod run's (up to 32 turns, replies of ~80–600 characters, outputs drawn log-normally and cut at
   ``env.output_cap_bytes`` = 10,000 bytes as the sandbox cuts them, 8 verifier checks, values and advantages on
   every turn). ``--run`` also reads a real run folder's files.
2. The step: a stand-in for the learner's update (float32 matmuls for ``--step-s`` seconds, the work a step's
   critical path does while the writer runs) timed with transcripts off, then with the step's ``--episodes``
   episodes queued to :class:`~rsi_jax.env.transcripts.TranscriptWriter` at the start of each step, exactly as
   ``RolloutPhase`` queues them (records built, encoded and written on the writer's thread), and the
   writer flushed before the next step (a checkpoint every step: the worst case). Reported: the caller's time to
   queue a step, the writer's time per step, and the step's wall time on vs off (median of ``--steps``
   steps, the two interleaved so that load from other processes hits both alike).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from rsi_jax.env.harness import Segment, Turn
from rsi_jax.env.episode import EpisodeResult
from rsi_jax.env.transcripts import (SUFFIX, TranscriptWriter, boundary_values, encode, episode_record,
                                     read_transcripts)
from rsi_jax.rl.ctrf import verification_outcome

WORDS = ("ls -la /app", "cat README.md", "grep -rn TODO src", "python3 -m pytest -q", "sed -i 's/a/b/' x.py",
         "cd /app && make", "find . -name '*.py'", "pip list", "echo done", "head -50 data.csv")


def _output(rng, n: int) -> str:
  lines, size = [], 0
  while size < n:
    line = " ".join(rng.choice(["total", "drwxr-xr-x", "root", "4096", "src", "test_", "ok", "FAILED", "line",
                                "error:", "warning:", "/app/x.py", "def", "return", "=", "0", "1", "True"],
                               size=rng.integers(3, 12)))
    lines.append(line)
    size += len(line) + 1
  return "\n".join(lines)[:n]


def synthetic_episode(rng, kind: str, cap: int = 10_000):
  """(EpisodeResult, per-turn values) shaped like a smoke or a pod episode."""
  turns_n = 2 if kind == "smoke" else int(rng.integers(4, 33))
  turns, gen_turns = [], []
  for k in range(turns_n):
    if kind == "smoke":
      reply, out = "".join(rng.choice(list("abcdefgh {}\":,"), size=40)), ""
      cmd = None
    else:
      cmd = str(rng.choice(WORDS)) + ("; " + str(rng.choice(WORDS)) if rng.random() < 0.4 else "")
      thought = " ".join(rng.choice(["check", "the", "file", "then", "run", "tests", "fix", "the", "bug"],
                                    size=int(rng.integers(10, 90))))
      reply = thought + "\n" + '{"command": "' + cmd + '", "done": false}'
      out_len = min(cap, int(rng.lognormal(6.5, 1.4)))  # median ≈ 665 bytes, a tail past the cap
      out = '{"exit_code": 0, "timed_out": false, "output": "' + _output(rng, out_len) + '"}'
    n_tok = max(1, len(reply) // 4)
    turns.append(Turn(k, 0, "action", np.zeros(50 * (k + 1), np.int32), np.zeros(n_tok, np.int32),
                      np.zeros(n_tok, np.float32), "eos", 3, text=reply, command=cmd, observation=out,
                      exit_code=0 if cmd else None, duration_s=float(rng.random())))
    gen_turns += [k] * n_tok
  tests = [(f"tests/test_outputs.py::test_check_{j}", "passed" if rng.random() < 0.5 else "failed")
           for j in range(8)]
  outcome = verification_outcome({"results": {"tests": [{"name": n, "status": s} for n, s in tests]}}, exit_code=1)
  gen = np.array([True] * len(gen_turns))
  seg = Segment(0, np.zeros(len(gen), np.int32), gen, np.zeros(len(gen), np.float32),
                np.array(gen_turns, np.int32), np.full(len(gen), 3, np.int32))
  e = EpisodeResult("some-task", "fam", "json", "bench", f"ep{rng.integers(1 << 30)}", outcome, turns=turns,
                    segments=[seg], stop_reason="max_turns", prompt_tokens=5000, generated_tokens=len(gen),
                    total_s=30.0)
  return e


def step_records(eps, rng):
  values = rng.normal(size=(len(eps), max(len(e.segments[0].ids) for e in eps))).astype(np.float32)
  adv = rng.normal(size=values.shape).astype(np.float32)
  vals = boundary_values(eps, values, adv, [True] * len(eps))
  return [episode_record(e, index=j, reward=0.25, divisor=8.0, values=vals[j], instruction="Fix the bug. " * 40,
                         output_cap_bytes=10_000) for j, e in enumerate(eps)]


def bytes_per_episode(kind: str, n: int, seed: int = 0) -> tuple[float, float]:
  rng = np.random.default_rng(seed)
  eps = [synthetic_episode(rng, kind) for _ in range(n)]
  recs = step_records(eps, rng)
  data = encode(recs)
  plain = sum(len(json.dumps(r, ensure_ascii=False)) + 1 for r in recs)
  return len(data) / n, plain / n


def busy(seconds: float, a: np.ndarray) -> int:
  t0, k = time.perf_counter(), 0
  while time.perf_counter() - t0 < seconds:
    a = (a @ a.T)[: a.shape[0], : a.shape[1]]
    a /= np.abs(a).max() + 1.0
    k += 1
  return k


def step_overhead(n_eps: int, steps: int, step_s: float, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  eps = [synthetic_episode(rng, "pod") for _ in range(n_eps)]
  a = rng.normal(size=(256, 256)).astype(np.float32)
  on, off, queue_s, writer_s, alone = [], [], [], [], []
  with tempfile.TemporaryDirectory() as d:
    for _ in range(max(1, steps // 2)):  # the writer's work alone: build the records, encode, write the file
      t0 = time.perf_counter()
      TranscriptWriter(Path(d) / "alone", background=False).write(0, step_records(eps, rng))
      alone.append(time.perf_counter() - t0)
    w = TranscriptWriter(Path(d) / "episodes")
    for i in range(steps):
      t0 = time.perf_counter()
      busy(step_s, a)
      off.append(time.perf_counter() - t0)

      t0 = time.perf_counter()
      w.write(i + 1, build=lambda i=i: step_records(eps, np.random.default_rng(i)))
      queue_s.append(time.perf_counter() - t0)
      busy(step_s, a)
      t_flush = time.perf_counter()
      w.flush()  # before the checkpoint
      on.append(time.perf_counter() - t0)
      writer_s.append(time.perf_counter() - t_flush)
    w.close()
    size = sum(p.stat().st_size for p in (Path(d) / "episodes").glob(f"*{SUFFIX}"))
  return {"off_s": statistics.median(off), "on_s": statistics.median(on), "queue_ms": 1e3 * statistics.median(queue_s),
          "flush_wait_ms": 1e3 * statistics.median(writer_s), "bytes_per_step": size / steps,
          "alone_ms": 1e3 * min(alone)}


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--episodes", type=int, default=256, help="episodes per step (rollout.global_batch)")
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--step-s", type=float, default=10.0, help="the stand-in update's seconds per step")
  ap.add_argument("--run", default="", help="a run folder whose transcript files to measure too")
  args = ap.parse_args()
  for kind, n in (("smoke", 256), ("pod", 256)):
    gz, plain = bytes_per_episode(kind, n)
    print(f"bytes per episode, {kind}-like ({n} episodes in one step file): {gz:,.0f} gzip ({plain:,.0f} as "
          f"plain JSON, {plain / gz:.1f}x)")
  if args.run:
    for f in sorted(Path(args.run).glob(f"**/*{SUFFIX}")):
      n = len(read_transcripts(f))
      if n:
        print(f"  {f.relative_to(args.run)}: {n} episodes, {f.stat().st_size / n:,.0f} bytes per episode")
  r = step_overhead(args.episodes, args.steps, args.step_s)
  print(f"step of {args.episodes} pod-like episodes, stand-in update {args.step_s:g} s, median of {args.steps}: "
        f"off {r['off_s']:.3f} s, on {r['on_s']:.3f} s ({100 * (r['on_s'] / r['off_s'] - 1):+.1f}%); queueing on "
        f"the step's path {r['queue_ms']:.2f} ms; waiting for the writer at the checkpoint {r['flush_wait_ms']:.1f} "
        f"ms; {r['bytes_per_step'] / 1e6:.2f} MB per step; the writer's work alone {r['alone_ms']:.0f} ms "
        f"({r['alone_ms'] / args.episodes:.1f} ms per episode)")


if __name__ == "__main__":
  main()
