"""What the run browser reads from a run folder, through etils.epath (a local folder or ``gs://...``).

Everything is read when a page is asked for, so a run that is still going shows what is there: a missing file
is an empty list, a JSON-lines file's cut last line is dropped, a transcript file is written whole (a temporary
name, then renamed) and is read as far as it goes.
"""

from __future__ import annotations

import json

import yaml
from etils import epath

from rsi_jax.env.transcripts import SUFFIX, read_transcripts
from rsi_jax.pipeline.metrics import read_jsonl


class RunFolder:
  """One run folder (``<run.output_dir>/<run.name>``)."""

  def __init__(self, path):
    self.root = epath.Path(path)

  def _json(self, rel, default):
    p = self.root / rel
    try:
      return json.loads(p.read_text()) if p.exists() else default
    except (json.JSONDecodeError, OSError):
      return default

  def lineage(self) -> list[dict]:
    got = self._json("lineage.json", [])
    return got if isinstance(got, list) else []

  def config(self) -> dict:
    p = self.root / "config.yml"
    try:
      got = yaml.safe_load(p.read_text()) if p.exists() else {}
    except (yaml.YAMLError, OSError):
      got = {}
    return got if isinstance(got, dict) else {}

  def plan(self) -> list[dict]:
    """The phase plan: the config's ``pipeline.phases`` in order, each with its lineage entry once it finished
    (``done``), and any phase folder the config does not name (an earlier plan of a resumed run)."""
    lineage = {e.get("phase"): e for e in self.lineage()}
    names = list(self.config().get("pipeline", {}).get("phases", []) or [])
    for e in self.lineage():
      if e.get("phase") not in names:
        names.append(e.get("phase"))
    phases_dir = self.root / "phases"
    if phases_dir.exists():
      for d in sorted(phases_dir.iterdir()):
        if d.name not in names:
          names.append(d.name)
    return [{"phase": n, "kind": (lineage.get(n) or {}).get("kind") or phase_kind(n), "done": n in lineage,
             "entry": lineage.get(n) or {}} for n in names]

  def metrics(self) -> list[dict]:
    return read_jsonl(self.root / "metrics.jsonl")

  def eval_metrics(self) -> list[dict]:
    return read_jsonl(self.root / "eval" / "metrics.jsonl")

  def eval_summary(self, phase: str, step: str) -> dict:
    return self._json(f"eval/{phase}/{step}/summary.json", {})

  def eval_runs(self) -> list[tuple[str, str]]:
    """(phase, step) of every evaluation folder, in the plan's order then by step."""
    d = self.root / "eval"
    out = []
    order = {p["phase"]: i for i, p in enumerate(self.plan())}
    if d.exists():
      for ph in d.iterdir():
        if ph.is_dir() and ph.name != "report":
          for st in ph.iterdir():
            if st.is_dir() and st.name.isdigit():
              out.append((ph.name, st.name))
    return sorted(out, key=lambda x: (order.get(x[0], -1 if x[0] == "base" else 1 << 20), int(x[1])))

  def transcript_files(self, phase: str) -> list[str]:
    """Names of a phase's transcript files: stage files first, then steps in order."""
    d = self.root / "phases" / phase / "episodes"
    if not d.exists():
      return []
    names = [p.name[:-len(SUFFIX)] for p in d.glob(f"*{SUFFIX}") if not p.name.startswith(".")]
    return sorted(names, key=lambda n: (n.isdigit(), int(n) if n.isdigit() else 0, n))

  def episodes(self, src: str) -> list[dict]:
    """The records of transcript file ``src`` (a path inside the run folder)."""
    return read_transcripts(self.resolve(src))

  def resolve(self, src: str):
    parts = [p for p in src.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts) or not src.endswith(SUFFIX):
      raise FileNotFoundError(src)
    return self.root.joinpath(*parts)

  def rows(self, rel: str) -> list[dict]:
    return read_jsonl(self.root / rel)

  def manifest(self, phase: str) -> dict:
    return self._json(f"phases/{phase}/rsr_manifest.json", {})


def phase_kind(name: str) -> str:
  """A phase's kind from its name (the driver's rule: rsrN, critic_seed, rprN)."""
  if name.startswith("rsr"):
    return "rsr"
  if name.startswith("rpr"):
    return "rpr"
  return name


def step_file(phase: str, step) -> str:
  return f"phases/{phase}/episodes/{step}{SUFFIX}"


def eval_file(phase: str, step) -> str:
  return f"eval/{phase}/{step}/episodes{SUFFIX}"
