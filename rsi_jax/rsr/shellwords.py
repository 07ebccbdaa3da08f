"""Reads commands out of runbook text: Markdown sections and code, simple commands and their words and operands.

The review gate and the leakage screen (:mod:`rsi_jax.rsr.review`) see runbooks and actions only through
these functions: a runbook's ``## Steps`` and ``## Checks`` become shell commands (:func:`commands`: code
blocks, code spans and bare command lines such as ``1. cd /app``), a shell text becomes simple commands
split into words (:func:`simple_commands`), and :func:`walk` follows ``cd`` so relative operands resolve
(:func:`resolve`) where the shell would find them.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Collection, Iterator, Sequence
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


def commands(text: str, programs: Collection[str] = ()) -> list[str]:
  """Shell commands in Markdown, in the order they appear: fenced code blocks (``` or ~~~, any info string),
  inline code spans, and bare lines that read as a command (:func:`bare_command`; ``programs``: names the
  task itself makes known as commands, beside :data:`BUILTINS` and :data:`PROGRAMS`)."""
  cmds, pos = [], 0
  for m in [*_FENCE.finditer(text), None]:
    for line in text[pos:m.start() if m else len(text)].splitlines():
      spans = [c.strip() for c in re.findall(r"`([^`\n]+)`", line)]
      cmds += spans if "`" in line else [bare_command(line, programs) or ""]
    if m:
      cmds.append(m.group(2).strip())
      pos = m.end()
  return [c for c in cmds if c]


BUILTINS = frozenset(
    ". : [ alias bg bind break builtin caller cd command compgen complete continue declare dirs disown echo "
    "enable eval exec exit export false fc fg getopts hash help history jobs kill let local logout mapfile "
    "popd printf pushd pwd read readarray readonly return set shift shopt source suspend test times trap true "
    "type typeset ulimit umask unalias unset wait".split())
PROGRAMS = frozenset(
    "apt apt-get awk base64 basename bash bc bunzip2 bzip2 cargo cat chgrp chmod chown cmp column comm conda cp "
    "crontab csvcut csvlook curl cut dash date dd df diff dirname dos2unix du egrep emacs env expand expr "
    "fgrep file find flock fmt fold free gcc gem git go grep groupadd groups gunzip gzip head hexdump "
    "hostname htop iconv id install ip ipython irb java javac jq less ln locale ls lsof make man md5sum mkdir "
    "mkfifo mktemp more mv mysql nano nc netstat nl node nohup npm npx nproc numfmt nvim od openssl paste "
    "patch perl pgrep php pico pip pip3 pkill printenv ps psql pytest python python3 readlink realpath rename "
    "rev rg rm rmdir rsync ruby rustc scp screen sed seq sh sha1sum sha256sum sha512sum shuf sleep sort split "
    "sqlite3 ss ssh stat strings su sudo sum systemctl tac tail tar tee time timeout tmux top touch tr "
    "tree truncate tsort tty uname uniq unzip useradd usermod uv vi vim watch wc wget whereis which whoami "
    "xargs xxd yarn yes zcat zip zsh".split())
# words of prose that a command line without quotes rarely has
_PROSE = frozenset("a all an and any are be each every for from how if in into is it its of on or out so "
                   "sure than that the them then these this those to up what when which with".split())
_SHELLISH = re.compile(r"(?:^|\s)[-~]|[/|<>&;=$'\"*\\]|\w\.\w")


def bare_command(line: str, programs: Collection[str] = ()) -> str | None:
  """The command of a Markdown line that gives one bare (no code span), else None: after an optional list
  marker (``-``, ``*``, ``+``, ``1.``, ``1)``) and ``$`` prompt, and any ``NAME=value`` assignments, the first
  word is a shell builtin, a common program or one of ``programs`` (or a path to one, or ``./`` a script);
  the rest reads as shell (an option, a path, an operator, a quote) and not as prose (two of its words are
  words like "the", "into", "it"), or is up to three words none of them such a word. A line that ends like a
  sentence (``word.``, ``:``) is prose."""
  m = re.match(r"^\s*(?:(?:[-*+]|\d+[.)])\s+)?(?:\$\s+)?(\S.*?)\s*$", line)
  if m is None or re.search(r"[A-Za-z]\.$|:$", m.group(1)):
    return None
  cmd = m.group(1)
  words = cmd.split()
  while len(words) > 1 and re.fullmatch(r"[A-Za-z_]\w*=\S*", words[0]):
    words = words[1:]
  prog, rest = words[0], words[1:]
  known = BUILTINS | PROGRAMS | set(programs)
  if not (prog in known or "/" in prog and (prog.startswith(("./", "../")) or Path(prog).name in known)):
    return None
  unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", " ", " ".join(rest)).split()
  prose = sum(w.lower() in _PROSE for w in unquoted)
  if prose >= 2 or (not _SHELLISH.search(" ".join(rest)) and (prose or len(rest) > 3)):
    return None
  return cmd


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
