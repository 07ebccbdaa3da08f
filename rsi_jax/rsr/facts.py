"""Mines what the gates know about a task: its public world, and the private names and values to keep out.

:func:`task_facts` reads a task folder once (cached per folder and modification time): the public text
(instruction, Dockerfile, the environment's text files), the container paths that exist where the
Dockerfile puts the environment, the verifier's and the reference solution's file names, and the literal
values the tests check that nothing public contains (a runbook that names one hard-codes an answer).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from rsi_jax.env.dockerfiles import dockerfile_layout
from rsi_jax.env.tasks import Task
from rsi_jax.rsr.shellwords import commands, join_path, simple_commands

SOLUTION_NAMES = ("solve.sh", "solution.sh")
SYSTEM_PREFIXES = ("/usr/", "/bin/", "/sbin/", "/lib", "/etc/", "/proc/", "/dev/", "/sys/", "/tmp/", "/var/",
                   "/opt/", "/root/", "/home/", "/run/")
COMMON_LITERALS = {"utf-8", "utf8", "ascii", "latin-1", "r:gz", "w:gz", "rb", "wb", "true", "false", "none",
                   "null", "__main__", "strict", "replace", "ignore"}


@dataclasses.dataclass(frozen=True)
class TaskFacts:
  """What the gates know about a task: the public world, and the private names and values to keep out."""
  instruction: str
  public_text: str  # instruction + Dockerfile + the environment's text files
  public_paths: frozenset[str]  # absolute container paths that exist (files and their directories)
  public_names: frozenset[str]  # base names of public files
  workdir: str
  test_names: frozenset[str]  # names of the verifier's files
  test_literals: tuple[str, ...]  # values in the tests that the public world does not contain
  solution_names: frozenset[str]
  test_script: str
  programs: frozenset[str] = frozenset()  # names the task makes known as commands (see _task_programs)


_FACTS: dict[tuple[str, float], TaskFacts] = {}


def task_facts(task: Task) -> TaskFacts:
  """The task's :class:`TaskFacts` (cached per folder and modification time)."""
  key = (str(task.path), Path(task.path).stat().st_mtime)
  if key not in _FACTS:
    _FACTS[key] = _task_facts(task)
  return _FACTS[key]


def _task_facts(task: Task) -> TaskFacts:
  ctx = Path(task.context_dir)
  files = [p for p in sorted(ctx.rglob("*")) if p.is_file()
           and p.relative_to(ctx).parts[0] not in set(task.context_exclude)]
  dockerfile = Path(task.dockerfile).read_text(errors="replace") if Path(task.dockerfile).is_file() else ""
  texts = [task.instruction, dockerfile] + [_read_text(p) for p in files]
  workdir, copies = dockerfile_layout(dockerfile)
  paths = {workdir}
  for p in files:
    rel = p.relative_to(ctx).as_posix()
    for src, dst in copies:
      src = src.rstrip("/")
      if src in (".", ""):
        paths.add(join_path(dst, rel))
      elif rel == src:
        paths.add(dst.rstrip("/") + "/" + Path(rel).name if dst.endswith("/") else dst)
      elif rel.startswith(src + "/"):
        paths.add(join_path(dst, rel[len(src) + 1:]))
  paths |= set(re.findall(r"(?<![\w.])(/[\w.\-/]+)", task.instruction + "\n" + dockerfile))
  with_parents = set()
  for p in paths:
    parts = p.rstrip("/").split("/")
    with_parents |= {"/".join(parts[:i]) or "/" for i in range(2, len(parts) + 1)}
  test_files = [p for p in sorted(Path(task.tests_dir).rglob("*")) if p.is_file()] \
      if Path(task.tests_dir).is_dir() else []
  test_files += [Path(p) for p in task.extra_test_files]
  public_names = frozenset(p.name for p in files)
  public_text = "\n".join(texts)
  def public(lit: str) -> bool:
    """Named by the public text, a public file's path (or its tail), or made only of public tokens (a
    line such as ``port = 9090`` composed from what the instruction says)."""
    tail = "/" + lit.lstrip("/").removeprefix("./")
    if mentions(public_text, lit) or lit in with_parents or any(p.endswith(tail) for p in with_parents):
      return True
    tokens = re.findall(r"[\w.\-/]+", lit)
    small = lambda t: re.fullmatch(r"[\d./\-]+", t) and len(re.sub(r"\D", "", t).strip("0")) < 3  # noqa: E731
    return len(tokens) > 1 and all(small(t) or mentions(public_text, t) for t in tokens)
  literals = sorted({lit for p in test_files for lit in _literals(p)
                     if lit.lower() not in COMMON_LITERALS and not public(lit)})
  sol_names = set(SOLUTION_NAMES)
  if task.solution is not None:
    sol = Path(task.solution)
    sol_names |= {p.name for p in sol.parent.iterdir() if p.is_file()} if sol.name == "solve.sh" else {sol.name}
  return TaskFacts(task.instruction, public_text, frozenset(with_parents), public_names, workdir,
                   frozenset(p.name for p in test_files) - public_names, tuple(literals),
                   frozenset(sol_names - public_names), task.test_script,
                   _task_programs(task.instruction, dockerfile, public_names))


def _task_programs(instruction: str, dockerfile: str, public_names: frozenset[str]) -> frozenset[str]:
  """Names a runbook for this task may run as commands beyond the common ones: the public scripts (``.sh``,
  ``.py``, ... files the environment ships), the programs the instruction's code runs (a script such as
  ``/app/retry.sh 3 0 cmd``, or a name given options such as ``mytool --check``; not every code span's first
  word, which is often a value), and the packages the Dockerfile installs (``apt-get install -y jq``: a
  package's name is usually its program's)."""
  script = re.compile(r"[\w.\-]+\.(sh|bash|py|pl|rb|js)")
  named = {Path(words[0]).name for c in commands(instruction) for words in simple_commands(c)
           if script.fullmatch(Path(words[0]).name) or any(w.startswith("-") for w in words[1:])}
  for line in re.findall(r"^\s*RUN\b(.*)$", dockerfile.replace("\\\n", " "), re.MULTILINE | re.IGNORECASE):
    for words in simple_commands(line):
      if "install" in words:
        named |= {w for w in words[words.index("install") + 1:] if not w.startswith("-")}
  return frozenset({n for n in public_names if script.fullmatch(n)}
                   | {n for n in named if re.fullmatch(r"[a-z][\w.+\-]*", n)})


def _read_text(p: Path, limit: int = 1 << 20) -> str:
  try:
    data = p.read_bytes()[:limit]
  except OSError:
    return ""
  return "" if b"\0" in data else data.decode("utf-8", errors="replace")


def _answer_like(v) -> str | None:
  """The text of a constant that could be a hard-coded answer, else None: strings of 4+ characters that are
  not a short plain word, a regular expression or a system path; numbers of 3+ significant digits."""
  if isinstance(v, bool) or v is None:
    return None
  if isinstance(v, (int, float)):
    digits = str(abs(v)).replace(".", "").strip("0")
    return str(v) if len(digits) >= 3 else None
  if not isinstance(v, str):
    return None
  v = v.strip()
  if len(v) < 4 or v.lower() in COMMON_LITERALS or "\n" in v.strip():
    return None
  if re.fullmatch(r"[A-Za-z_]+", v):
    return None  # a key, a word of prose, an argument name, an error class
  if re.search(r"[\[\]()*+?^$\\|{}]", v) or v.startswith(SYSTEM_PREFIXES) or "," in v and " " in v:
    return None  # a regular expression, a system path, parametrize argument names ("given, want")
  return v


def _literals(path: Path) -> set[str]:
  """Values a test checks results against: constants inside comparisons (``==``, ``in``, ...), in
  module-level UPPER_CASE tables of expected values and in ``parametrize`` cases; for other files of the
  tests (expected outputs), their lines; for shell scripts, quoted strings. Filtered by :func:`_answer_like`."""
  text = _read_text(path)
  if path.suffix != ".py":
    if path.suffix in (".sh", ".bash"):
      found = [a or b for a, b in re.findall(r'"([^"\n$`]{4,})"|\'([^\'\n]{4,})\'', text)]
    else:
      found = [ln.strip() for ln in text.splitlines() if len(ln.strip()) >= 8]
    return {x for x in map(_answer_like, found) if x is not None}
  try:
    tree = ast.parse(text)
  except SyntaxError:
    return set()
  roots = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Compare):
      roots += [x for x in (node.left, *node.comparators) if not isinstance(x, ast.Call)]  # not a call's inputs
    elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node in tree.body:
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      if any(isinstance(t, ast.Name) and t.id.isupper() for t in targets) and node.value is not None:
        v = node.value
        roots += list(v.values) if isinstance(v, ast.Dict) else [v]  # a table's values, not its keys
  out = set()
  for r in roots:
    for n in _constants(r):
      v = _answer_like(n.value)
      if v is not None:
        out.add(v)
  return out


def _constants(node):
  """Constants under ``node``, not inside f-strings or calls (a call's arguments are inputs)."""
  if isinstance(node, ast.Constant):
    yield node
  elif not isinstance(node, (ast.JoinedStr, ast.Call)):
    for child in ast.iter_child_nodes(node):
      yield from _constants(child)


def mentions(text: str, value: str) -> bool:
  """``value`` occurs in ``text`` as a whole token (not as part of a longer word or number)."""
  if re.fullmatch(r"[\w.\-]+", value):
    return re.search(r"(?<![\w.\-])" + re.escape(value) + r"(?![\w\-]|\.\w)", text) is not None
  return value in text
