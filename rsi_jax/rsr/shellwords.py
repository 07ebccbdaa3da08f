"""Reads commands out of runbook text: Markdown sections and code, simple commands and their words and operands.

The review gate and the leakage screen (:mod:`rsi_jax.rsr.review`) see runbooks and actions only through
these functions: a runbook's ``## Steps`` and ``## Checks`` become shell commands (:func:`commands`), a
shell text becomes simple commands split into words (:func:`simple_commands`), and :func:`walk` follows
``cd`` so relative operands resolve (:func:`resolve`) where the shell would find them.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path

SCRIPT_FIRST = {"sed", "awk", "grep", "egrep", "fgrep", "jq"}  # the first operand is a script / pattern

_FENCE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.DOTALL | re.MULTILINE)


def sections(runbook: str) -> dict[str, str]:
  """Sections of a Markdown runbook by heading (``#`` to ``###``, numbering and trailing punctuation
  allowed, headings inside code fences ignored): {first word of the heading, e.g. "Steps": body}."""
  fenced = [(m.start(), m.end()) for m in _FENCE.finditer(runbook)]
  out, name, start = {}, None, 0
  for m in re.finditer(r"^#{1,3}[ \t]+(?:\d+[.)][ \t]*)?([A-Za-z]+)[^\n]*$", runbook, re.MULTILINE):
    if any(a <= m.start() < b for a, b in fenced):
      continue
    if name is not None:
      out.setdefault(name, runbook[start:m.start()].strip())
    name, start = m.group(1).capitalize(), m.end()
  if name is not None:
    out.setdefault(name, runbook[start:].strip())
  return out


def commands(text: str) -> list[str]:
  """Shell commands in Markdown: fenced code blocks (``` or ~~~, any info string) and inline code spans."""
  cmds = [m.group(2).strip() for m in _FENCE.finditer(text)]
  rest = _FENCE.sub("", text)
  cmds += [c.strip() for c in re.findall(r"`([^`\n]+)`", rest)]
  return [c for c in cmds if c]


def strip_heredocs(cmd: str) -> str:
  """A shell text without the bodies of its here-documents (they are data, not commands)."""
  lines, out, end = cmd.splitlines(), [], None
  for line in lines:
    if end is not None:
      if line.strip() == end:
        end = None
      continue
    out.append(line)
    m = re.search(r"<<-?\s*(['\"]?)(\w+)\1", line)
    if m:
      end = m.group(2)
  return "\n".join(out)


def simple_commands(cmd: str) -> list[list[str]]:
  """Simple commands of a shell text (here-document bodies dropped; split at pipes, ;, &&, ||, newlines),
  each as words."""
  out = []
  for part in re.split(r"\|\||&&|[|;\n]", strip_heredocs(cmd)):
    try:
      w = shlex.split(part, comments=True)
    except ValueError:
      w = part.split()
    if w:
      out.append(w)
  return out


def is_path(w: str) -> bool:
  """``w`` reads as a file path (a slash or a file extension; no option, glob, variable, URL or number)."""
  return ("/" in w or re.search(r"\.\w{1,5}$", w) is not None) and not w.startswith("-") \
      and not re.search(r"[*?$\{\}<>=\\\[\]]", w) and "://" not in w and not re.fullmatch(r"[\d.]+", w)


def join_path(a: str, b: str) -> str:
  """``b`` under the folder ``a`` (``a`` itself when ``b`` is empty)."""
  return (a.rstrip("/") + "/" + b) if b else a


def resolve(w: str, cwd: str) -> str:
  """The absolute, normalised path a word names when run in ``cwd``."""
  return os.path.normpath(w if w.startswith("/") else join_path(cwd, w))


def operands(prog: str, args: list[str]) -> list[str]:
  """The file operands of a simple command (a script / pattern operand and inline code skipped)."""
  out, skip_script = [], prog in SCRIPT_FIRST
  if any(a in ("-e", "-f", "--expression", "--file") for a in args):
    skip_script = False
  for a in args:
    if a == "-c" and (prog.startswith("python") or prog in ("sh", "bash", "dash", "zsh")):
      break  # inline code follows
    if a.startswith("-"):
      continue
    if skip_script:
      skip_script = False
      continue
    out.append(a)
  return out


def walk(cmds: Sequence[str], workdir: str) -> Iterator[tuple[str, list[str], str, str]]:
  """For each simple command in order: (program, words, cwd, the command text it came from) — ``cd``
  followed."""
  cwd = workdir
  for cmd in cmds:
    for words in simple_commands(cmd):
      prog = Path(words[0]).name
      if prog == "cd" and len(words) > 1 and "$" not in words[1]:
        cwd = resolve(words[1], cwd)
      yield prog, words, cwd, cmd
