"""Every training metric through one logger: ``metrics.jsonl``, TensorBoard events and PNG plots.

One record per phase step: ``{"phase", "kind", "step", "global_step", "time", <metric>: float, ...}``.
TensorBoard scalars are tagged ``<phase>/<metric>`` at the run's global step (steps of all phases in order);
plots (``plots/<metric>.png``) show each phase's raw points and a causal mean of up to five.
On resume the records of steps that are about to be redone (after the restored checkpoint) are dropped from
``metrics.jsonl`` and ``eval/metrics.jsonl``, and TensorBoard is told to hide their events (a purge step), so
each step is recorded once. A file whose last line was cut by a kill mid-write is repaired before anything is
appended to it.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid

from etils import epath

from rsi_jax.jsonl import parse_lines

# metric name in the records -> plot title; what a person reads to see whether the run learns
PLOTS = {
    "reward_mean": "reward (mean over used episodes)",
    "success_mean": "strict success (mean over used episodes)",
    "turns_mean": "turns per episode",
    "value/explained_variance": "critic explained variance",
    "advantage_abs_mean": "RPR: mean |advantage| over generated tokens",
    "mismatch/abs_mean": "train-inference |log-prob gap|",
    "nll_per_token": "RSR: SFT NLL per generated token",
    "value/value_loss": "critic value loss",
}
SMOOTH = 5  # the causal mean of the plots: the point and up to four before it


def read_jsonl(path) -> list[dict]:
  """The records of a JSON-lines file ([] if it does not exist); a last line cut by a kill mid-write is
  dropped."""
  path = epath.Path(path)
  if not path.exists():
    return []
  return parse_lines(path.read_text())


def _repair_cut_line(path):
  """A JSON-lines file whose last line was cut (no final newline: a kill mid-write) loses that line, so the next
  record starts on a line of its own instead of being glued to the cut one."""
  path = epath.Path(path)
  if not path.exists():
    return
  text = path.read_text()
  if text and not text.endswith("\n"):
    head, _, cut = text.rpartition("\n")
    logging.warning("%s: dropping its last line, cut by an interrupted write (%d bytes)", path, len(cut))
    path.write_text(head + "\n" if head else "")


def causal_mean(ys: list[float], window: int = SMOOTH) -> list[float]:
  """y'_i = mean(y_{max(0, i-window+1)} .. y_i), ignoring NaNs (NaN only if the whole window is)."""
  out = []
  for i in range(len(ys)):
    w = [y for y in ys[max(0, i - window + 1):i + 1] if not math.isnan(y)]
    out.append(sum(w) / len(w) if w else float("nan"))
  return out


class MetricLogger:
  """Writes metric records under ``run_dir``; ``log`` for each phase step, ``plot`` when a phase ends.
  ``writes=False`` (the other processes of a multi-host run): records are kept in memory only."""

  def __init__(self, run_dir: str, *, tensorboard: bool = True, writes: bool = True):
    self.dir = epath.Path(run_dir)
    self.path = self.dir / "metrics.jsonl"
    self.eval_path = self.dir / "eval" / "metrics.jsonl"
    self.writes = writes
    self.records: list[dict] = read_jsonl(self.path)
    if writes:
      for f in (self.path, self.eval_path):
        _repair_cut_line(f)
    self._tb = None
    self._tensorboard = tensorboard and writes
    self._plotted: tuple[list[dict], list[str]] | None = None  # the records last drawn, and the files

  def _writer(self):
    """TensorBoard's writer, opened on first use; its first event tells TensorBoard to hide the events of an
    earlier attempt at the global steps from here on (they are being redone)."""
    if self._tb is None and self._tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(str(self.dir / "tensorboard"), flush_secs=10, purge_step=len(self.records) + 1,
                               filename_suffix=f".{uuid.uuid4().hex[:8]}")  # two attempts in one second: two files
    return self._tb

  def truncate(self, phase_order: list[str], phase: str, step: int):
    """Drop the records after ``phase`` step ``step`` (and of later phases), and the in-training evaluations
    after that step of ``phase``: they are about to be redone."""
    rank = {p: i for i, p in enumerate(phase_order)}
    keep = [r for r in self.records if rank.get(r["phase"], -1) < rank[phase]
            or (r["phase"] == phase and r["step"] <= step)]
    if len(keep) != len(self.records):
      self.records = keep
      if self.writes:
        self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))
      if self._tb is not None:  # reopened at the next record: the purge step follows the records kept
        self._tb.close()
        self._tb = None
    if self.writes and self.eval_path.exists():
      evals = read_jsonl(self.eval_path)
      kept = [r for r in evals if not (r["phase"] == phase and r["step"] > step)]
      if len(kept) != len(evals):
        self.eval_path.write_text("".join(json.dumps(r) + "\n" for r in kept))

  def log(self, phase: str, kind: str, step: int, metrics: dict) -> dict:
    rec = {"phase": phase, "kind": kind, "step": int(step), "global_step": len(self.records) + 1,
           "time": round(time.time(), 3)}
    for k, v in metrics.items():
      rec[k] = _plain(v)
    tb = self._writer()  # before the record counts: the purge step is this record's global step
    self.records.append(rec)
    if self.writes:
      with self.path.open("a") as f:
        f.write(json.dumps(rec) + "\n")
    if tb is not None:
      for k, v in rec.items():
        if k not in ("phase", "kind", "step", "global_step", "time") and isinstance(v, (int, float)) \
            and not isinstance(v, bool) and v is not None:
          self._tb.add_scalar(f"{phase}/{k}", float(v), rec["global_step"])
    return rec

  def log_eval(self, phase: str, step: int, suite: str, metrics: dict) -> dict:
    """An in-training evaluation: a record in ``eval/metrics.jsonl`` and TensorBoard scalars
    ``eval/<suite>/<metric>`` at the current global step."""
    rec = {"phase": phase, "step": int(step), "global_step": len(self.records), "suite": suite,
           "time": round(time.time(), 3), **{k: _plain(v) for k, v in metrics.items()}}
    if not self.writes:
      return rec
    self.eval_path.parent.mkdir(parents=True, exist_ok=True)
    with self.eval_path.open("a") as f:
      f.write(json.dumps(rec) + "\n")
    if self._writer() is not None:
      for k, v in metrics.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
          self._tb.add_scalar(f"eval/{suite}/{k}", float(v), rec["global_step"])
    return rec

  def plot(self) -> list[str]:
    """One PNG per metric in :data:`PLOTS` that has data: every phase's raw points and causal mean. Records
    already drawn (the run's end right after its last phase's) are not drawn again."""
    if not self.writes:
      return []
    if self._plotted is not None and self._plotted[0] == self.records and all(
        epath.Path(f).exists() for f in self._plotted[1]):
      return list(self._plotted[1])
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = self.dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for key, title in PLOTS.items():
      rows = [r for r in self.records if isinstance(r.get(key), (int, float))]
      if not rows:
        continue
      fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
      phases = list(dict.fromkeys(r["phase"] for r in rows))
      for i, ph in enumerate(phases):
        pts = [r for r in rows if r["phase"] == ph]
        xs = [r["global_step"] for r in pts]
        ys = [float(r[key]) for r in pts]
        color = f"C{i % 10}"
        ax.plot(xs, ys, "o", color=color, alpha=0.35, markersize=4, label=f"{ph} (raw)")
        ax.plot(xs, causal_mean(ys), "-", color=color, linewidth=2, label=f"{ph} (mean of last {SMOOTH})")
      ax.set_title(title)
      ax.set_xlabel("training step (all phases)")
      ax.set_ylabel(key)
      ax.grid(alpha=0.3)
      ax.legend(fontsize=8, loc="best")
      fig.tight_layout()
      path = out_dir / (key.replace("/", "_") + ".png")
      with path.open("wb") as f:
        fig.savefig(f, format="png")
      plt.close(fig)
      written.append(str(path))
    self._plotted = ([dict(r) for r in self.records], written)
    return written

  def close(self):
    if self._tb is not None:
      self._tb.close()
      self._tb = None


def _plain(v):
  if hasattr(v, "item"):
    v = v.item()
  if isinstance(v, float) and not math.isfinite(v):
    return None  # JSON has no NaN / inf; a non-finite update is counted in "skipped_updates"
  return v
