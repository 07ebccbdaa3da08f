"""The run folder: where a run's records and checkpoints lie, and what its records say about the run.

``<run.output_dir>/<run.name>/`` holds ``config.yml``, ``lineage.json``, ``metrics.jsonl``, the logs, the phases'
work folders and (unless ``pipeline.checkpoint_dir`` puts them elsewhere) ``checkpoints/<phase>/<step>/``. Paths
inside it are stored relative to it (:func:`run_paths`), so a copied or moved run folder resumes from itself.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess

from etils import epath

from rsi_jax.config import REPO_ROOT, Config, dump_config
from rsi_jax.models.checkpoint import join, local_or_url

LINEAGE = "lineage.json"


def run_dir_of(cfg: Config) -> str:
  return local_or_url(join(cfg.run.output_dir, cfg.run.name))


def checkpoint_root(cfg: Config) -> str:
  """Where the phases' checkpoint folders go; an object-store URL is kept exactly as given."""
  return local_or_url(cfg.pipeline.checkpoint_dir or join(run_dir_of(cfg), "checkpoints"))


def existing_run(cfg: Config) -> list[str]:
  """What of an earlier run the run folder holds (empty: a new run)."""
  rd, found = epath.Path(run_dir_of(cfg)), []
  for f in (LINEAGE, "metrics.jsonl"):
    if (rd / f).exists():
      found.append(f)
  ck = epath.Path(checkpoint_root(cfg))
  # a step folder, not the empty phase folders (and config.yml, train.log) a start that failed leaves behind
  if ck.exists() and any(s.name.isdigit() for p in ck.iterdir() if p.is_dir() for s in p.iterdir()):
    found.append(str(ck))
  return found


def run_paths(entry: dict, run_dir: str, absolute: bool) -> dict:
  """A lineage entry (or a checkpoint's ``started_from``) with the paths inside the run folder made relative to
  it (``absolute=False``: as stored, so a copied or moved run folder points into itself) or absolute again (as
  used). Paths elsewhere (another run's checkpoint, an object store, ``hf:...``) and descriptions stay as they
  are."""
  def conv(p):
    if not isinstance(p, str) or "://" in p or p.startswith("hf:"):
      return p
    if absolute:
      return join(run_dir, p) if not os.path.isabs(p) and epath.Path(join(run_dir, p)).exists() else p
    if "://" not in run_dir and os.path.isabs(p):
      rel = os.path.relpath(p, run_dir)
      return p if rel == ".." or rel.startswith(".." + os.sep) else rel
    if "://" in run_dir and p.startswith(run_dir + "/"):
      return p[len(run_dir) + 1:]
    return p
  out = dict(entry)
  for k in ("output", "actor", "critic"):
    if k in out:
      out[k] = conv(out[k])
  if isinstance(out.get("started_from"), dict):
    out["started_from"] = run_paths(out["started_from"], run_dir, absolute)
  if isinstance(out.get("rsr"), dict) and "manifest" in out["rsr"]:
    out["rsr"] = dict(out["rsr"], manifest=conv(out["rsr"]["manifest"]))
  return out


@functools.cache
def code_version() -> str:
  try:
    p = subprocess.run(["git", "describe", "--always", "--dirty", "--tags"], cwd=REPO_ROOT, capture_output=True,
                       text=True, timeout=10)
    if p.returncode == 0 and p.stdout.strip():
      return p.stdout.strip()
  except (OSError, subprocess.SubprocessError):
    pass
  from importlib.metadata import PackageNotFoundError, version
  try:
    return f"rsi_jax {version('rsi_jax')}"
  except PackageNotFoundError:
    return "unknown"


def config_digest(cfg: Config) -> str:
  return hashlib.sha256(dump_config(cfg).encode()).hexdigest()[:16]


# settings that do not change what a run computes: the console, resuming, and where the run folder lies (a
# copied or moved run resumes from its own folder)
_NOT_TRAINING = ("run.progress", "run.log_level", "run.resume", "run.allow_config_change", "run.preempt_budget_s",
                 "run.name", "run.output_dir")


def training_settings(config_yaml: str) -> dict:
  """A dumped config as ``{dotted key: value}``, without :data:`_NOT_TRAINING`."""
  import yaml

  def flat(d, prefix=""):
    for k, v in d.items():
      if isinstance(v, dict) and v:
        yield from flat(v, f"{prefix}{k}.")
      else:
        yield f"{prefix}{k}", v
  return {k: v for k, v in flat(yaml.safe_load(config_yaml) or {}) if k not in _NOT_TRAINING}
