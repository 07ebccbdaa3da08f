"""Episode transcripts: what the agent did, kept in the run folder as gzip JSON lines, written off the step.

One file per rollout step (``phases/<phase>/episodes/<step>.jsonl.gz``), per RSR funnel stage
(``phases/<phase>/episodes/<stage>.jsonl.gz``: ``discovery``, ``execution``) and per evaluation
(``eval/<phase>/<step>/episodes.jsonl.gz``). Each line is one episode (:func:`episode_record`):

* the episode: task, family, harness, the weight versions that sampled it, stop reason, infrastructure kind,
  verification state, success, the verifier's checks (name, CTRF status, hygiene or not), the reward and the
  divisor it was computed with, timings, token counts, the harness's output cap;
* per turn: the reply as decoded, the parsed command or the malformed-reply reason, the output as the agent
  saw it (the observation the harness rendered, cut by ``env.output_cap_bytes``), exit status, timings, and
  for RPR the critic's value and the TB-GAE advantage at the turn's first generated token (its boundary).

:class:`TranscriptWriter` writes on a background thread; a file is written whole (a temporary name, then
renamed), so a step's file is either complete or absent, and a redone step replaces its file. ``flush``
waits for what is queued (before a checkpoint, at a phase's end, on a stop). ``run.keep_transcripts`` picks
the episodes of a step: ``all``, ``failures`` (no success, infrastructure failures included) or
``sample:N`` (N of them, drawn from a seed: the same N on a rerun).
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import queue
import re
import threading
from collections.abc import Iterable, Sequence

import numpy as np
from etils import epath

from rsi_jax.jsonl import parse_lines

log = logging.getLogger(__name__)

SUFFIX = ".jsonl.gz"
FORMAT = 1  # the record layout's version


def parse_keep(mode: str) -> tuple[str, int]:
  """``run.keep_transcripts`` as (kind, n): ("all", 0), ("failures", 0) or ("sample", N)."""
  if mode in ("all", "failures"):
    return mode, 0
  m = re.fullmatch(r"sample:([0-9]+)", mode)
  if m is None or int(m.group(1)) < 1:
    raise ValueError(f"run.keep_transcripts: must be 'all', 'failures' or 'sample:N' with N >= 1, got {mode!r}")
  return "sample", int(m.group(1))


def select(episodes: Sequence, mode: str, seed: int) -> list[int]:
  """Indices (ascending) of the episodes ``mode`` keeps; ``seed`` draws the sample of ``sample:N``."""
  kind, n = parse_keep(mode)
  if kind == "all":
    return list(range(len(episodes)))
  if kind == "failures":
    return [i for i, e in enumerate(episodes) if e.infra_failure or e.success != 1]
  if n >= len(episodes):
    return list(range(len(episodes)))
  rng = np.random.default_rng(int(seed))
  return sorted(int(i) for i in rng.choice(len(episodes), size=n, replace=False))


def boundary_values(episodes: Sequence, values, advantages, trained: Sequence[bool]) -> list[dict]:
  """Per episode, {turn index: (value, advantage)} at each turn's first generated token, read from a step's
  sample-layout arrays (``values`` / ``advantages``: (rows, T), one row per segment, the episodes' segments
  in order, as :func:`rsi_jax.rl.batch.assemble_batch` lays them out). Episodes not ``trained`` (masked out:
  their values were not computed) get {}."""
  values, advantages = np.asarray(values), np.asarray(advantages)
  out, row = [], 0
  for e, ok in zip(episodes, trained):
    per: dict = {}
    for seg in e.segments:
      if ok:
        gen = np.asarray(seg.gen_mask, bool)
        tid = np.asarray(seg.turn_ids)
        for pos in np.flatnonzero(gen):
          t = int(tid[pos])
          if t not in per:
            per[t] = (float(values[row, pos]), float(advantages[row, pos]))
      row += 1
    out.append(per)
  return out


def _checks(outcome) -> list[dict]:
  rep = outcome.report
  if rep is None:
    return []
  return [{"name": n, "status": s, "hygiene": bool(h)} for n, s, h in rep.checks]


def episode_record(e, *, index: int | None = None, reward: float | None = None, divisor: float | None = None,
                   values: dict | None = None, instruction: str | None = None, output_cap_bytes: int | None = None,
                   extra: dict | None = None) -> dict:
  """The transcript of one :class:`~rsi_jax.env.episode.EpisodeResult` (JSON-serializable). ``values``: {turn
  index: (critic value, TB-GAE advantage)} (:func:`boundary_values`); ``extra``: more episode fields (the
  funnel's runbook, an evaluation's repeat)."""
  o = e.outcome
  values = values or {}
  versions = sorted({int(t.weight_version) for t in e.turns if t.weight_version >= 0})
  turns = []
  for t in e.turns:
    v = values.get(t.index)
    turns.append({
        "index": int(t.index), "segment": int(t.segment), "kind": t.kind, "reply": t.text,
        "finish_reason": t.finish_reason, "weight_version": int(t.weight_version),
        "version_changed": bool(t.version_changed), "command": t.command, "done": bool(t.done),
        "malformed": t.error or None, "output": t.observation, "exit_code": t.exit_code,
        "timed_out": bool(t.timed_out), "duration_s": round(float(t.duration_s), 4),
        "prompt_tokens": int(t.prompt_len), "sampled_tokens": int(len(t.sampled_ids)),
        "value": None if v is None else v[0], "advantage": None if v is None else v[1]})
  rec = {
      "format": FORMAT, "episode_id": e.episode_id, "index": index, "task": e.task, "family": e.family,
      "harness": e.harness, "weight_versions": versions, "stop_reason": e.stop_reason,
      "infra_failure": bool(e.infra_failure), "failure_kind": e.failure_kind, "error": e.error,
      "state": o.state.value, "success": o.success, "passed": o.passed, "total": o.total,
      "verifier_reason": o.reason, "terminal_reward": o.terminal_reward, "checks": _checks(o),
      "reward": None if reward is None else float(reward), "divisor": None if divisor is None else float(divisor),
      "prompt_tokens": int(e.prompt_tokens), "generated_tokens": int(e.generated_tokens),
      "times": {k: round(float(getattr(e, k)), 3) for k in ("build_s", "start_s", "agent_s", "verify_s", "total_s")},
      "output_cap_bytes": output_cap_bytes, "instruction": instruction, "turns": turns}
  if extra:
    rec.update(extra)
  return rec


def text_summary(rec: dict, max_chars: int = 600) -> str:
  """One transcript as Markdown for TensorBoard's text tab: the outcome line, then each turn's command (or
  malformed reason) and output, each cut at ``max_chars``."""
  cut = lambda s: s if len(s) <= max_chars else s[:max_chars] + " [...]"  # noqa: E731
  head = (f"**{rec['task']}** ({rec['family']}, {rec['harness']}): success {rec['success']}, checks "
          f"{rec['passed']}/{rec['total']}, reward {rec['reward']}, stop {rec['stop_reason']}"
          + (f", infra {rec['failure_kind']}" if rec.get("failure_kind") else ""))
  lines = [head, ""]
  for t in rec["turns"]:
    va = "" if t.get("value") is None else f" (value {t['value']:.4g}, advantage {t['advantage']:.4g})"
    if t.get("command") is not None:
      what = f"`$ {cut(t['command'])}` exit {t['exit_code']}"
    elif t.get("malformed"):
      what = f"malformed: {cut(t['malformed'])}"
    else:
      what = "done" if t.get("done") else t["kind"]
    lines.append(f"turn {t['index']}{va}: {what}")
    if t.get("command") is not None and t.get("output"):
      lines += ["", "    " + cut(t["output"]).replace("\n", "\n    "), ""]
  return "\n".join(lines)


def encode(records: Iterable[dict]) -> bytes:
  """gzip JSON lines (one record a line)."""
  buf = io.BytesIO()
  with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=6, mtime=0) as f:
    for r in records:
      f.write((json.dumps(r, ensure_ascii=False) + "\n").encode())
  return buf.getvalue()


def read_transcripts(path) -> list[dict]:
  """The records of a transcript file ([] if absent); a cut last line (a file still being written by other
  means, a truncated copy) is dropped."""
  path = epath.Path(path)
  if not path.exists():
    return []
  raw = path.read_bytes()
  try:
    text = gzip.decompress(raw).decode("utf-8", errors="replace")
  except (EOFError, OSError, gzip.BadGzipFile):
    text = _partial_gunzip(raw)
  return parse_lines(text)


def _partial_gunzip(raw: bytes) -> str:
  import zlib
  d = zlib.decompressobj(16 + zlib.MAX_WBITS)
  try:
    return d.decompress(raw).decode("utf-8", errors="replace")
  except zlib.error:
    return ""


class TranscriptWriter:
  """Writes transcript files of one folder on a background thread (``background=False``: at once, in the
  caller). ``write(name, records)`` queues ``<dir>/<name>.jsonl.gz``; ``flush()`` waits until every queued
  file is on storage and re-raises a write's error; ``close()`` flushes and stops the thread."""

  def __init__(self, directory, background: bool = True):
    self.dir = epath.Path(directory)
    self.background = background
    self._q: queue.Queue = queue.Queue()
    self._error: BaseException | None = None
    self._thread: threading.Thread | None = None
    self.bytes_written = 0
    self.files_written = 0

  def path(self, name) -> epath.Path:
    return self.dir / f"{name}{SUFFIX}"

  def write(self, name, records: Sequence[dict] | None = None, build=None):
    """Queue the file ``name`` with ``records``, or with what ``build()`` returns (built on the writer's
    thread: a caller on the step's critical path hands over the work of building the records too)."""
    if not self.background:
      self._write(name, records, build)
      return
    if self._thread is None:
      self._thread = threading.Thread(target=self._loop, name="transcripts", daemon=True)
      self._thread.start()
    self._q.put((name, records, build))

  def _write(self, name, records, build):
    data = encode(build() if build is not None else records)
    self.dir.mkdir(parents=True, exist_ok=True)
    final = self.path(name)
    tmp = self.dir / f".{name}{SUFFIX}.tmp"
    tmp.write_bytes(data)
    tmp.replace(final)
    self.bytes_written += len(data)
    self.files_written += 1

  def _loop(self):
    while True:
      item = self._q.get()
      try:
        if item is None:
          return
        try:
          self._write(*item)
        except BaseException as e:  # noqa: BLE001 - kept and raised by flush() in the caller's thread
          log.exception("transcript %s not written", item[0])
          self._error = self._error or e
      finally:
        self._q.task_done()

  def flush(self):
    if self._thread is not None:
      self._q.join()
    if self._error is not None:
      e, self._error = self._error, None
      raise e

  def close(self):
    try:
      self.flush()
    finally:
      if self._thread is not None:
        self._q.put(None)
        self._thread.join()
        self._thread = None

  def remove_after(self, step: int):
    """Delete the step files numbered above ``step`` (resuming: those steps are redone and written again)."""
    if not self.dir.exists():
      return
    for p in self.dir.glob(f"*{SUFFIX}"):
      stem = p.name[:-len(SUFFIX)]
      if stem.isdigit() and int(stem) > step:
        p.unlink()
