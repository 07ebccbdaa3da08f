"""Runbooks and the RSR templates (I_plan, I_exec, the judge's), versioned files under ``configs/rsr/``.

A template is Markdown with ``${name}`` placeholders and a first-line HTML comment naming it and its version
(the comment is not sent to the model). Its digest goes into the phase's manifest, so a changed template is
visible in every run that used it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import string
from collections.abc import Sequence
from pathlib import Path

from rsi_jax.config import REPO_ROOT


@dataclasses.dataclass(frozen=True)
class Template:
  path: str
  text: str  # without the leading comment
  digest: str  # sha256 of the file, first 12 hex digits
  version: str  # from the comment ("version N"), "" if none

  def render(self, **values: str) -> str:
    missing = [n for n in re.findall(r"\$\{(\w+)\}", self.text) if n not in values]
    if missing:
      raise KeyError(f"{self.path}: no value for placeholder(s) {sorted(set(missing))}")
    return string.Template(self.text).substitute(**values)


def load_template(path: str) -> Template:
  """A template file; a relative path is looked up from the working directory, then the repository."""
  p = Path(path)
  if not p.is_absolute() and not p.exists() and (REPO_ROOT / p).exists():
    p = REPO_ROOT / p
  try:
    raw = p.read_text()
  except OSError as e:
    raise FileNotFoundError(f"RSR template {path}: cannot read ({e})") from None
  m = re.match(r"\s*<!--(.*?)-->\s*\n", raw, re.DOTALL)
  version = ""
  if m:
    v = re.search(r"version\s+([\w.]+)", m.group(1))
    version = v.group(1) if v else ""
  text = raw[m.end():] if m else raw
  return Template(str(p), text.strip() + "\n", hashlib.sha256(raw.encode()).hexdigest()[:12], version)


def parse_runbook(reply: str) -> str:
  """The runbook in a model's reply: reasoning (``<think>``) removed, an enclosing Markdown fence
  unwrapped, surrounding whitespace stripped."""
  text = re.sub(r"<think>.*?</think>", "", reply, flags=re.DOTALL).strip()
  m = re.fullmatch(r"```(?:markdown|md)?\s*\n(.*?)\n```", text, re.DOTALL)
  return (m.group(1) if m else text).strip()


def write_runbook(goal: str, commands: Sequence[str], workdir: str) -> str:
  """A runbook in I_plan's three sections: ``goal``, one step per command in order (a fenced ``bash`` block
  each), and a check listing ``workdir``. What the scripted planner writes from C(τ) and what the stand-in
  Base's corpus teaches (``rsr.corpus_runbooks``)."""
  steps = "\n".join(f"{i + 1}. Run:\n```bash\n{c.strip()}\n```" for i, c in enumerate(commands))
  return (f"## Goal\n{goal}\n\n## Steps\n{steps}\n\n## Checks\n- `ls -la {workdir}` lists the files the task "
          f"asks for.\n")
