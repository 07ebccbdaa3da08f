"""The review gate q(x, b) and the leakage screen q_leak(τ) (paper §2.1, SPEC §5).

:func:`review` sees only what is public about a task — its instruction and its environment (the build
context and the Dockerfile) — and the runbook. It is rule-based and deterministic; every failed rule adds a
reason code (``schema``, ``artifact``, ``compatibility``, ``leakage:<kind>``) and a human-readable detail:

* **schema** — Markdown with the sections ``## Goal``, ``## Steps``, ``## Checks``, none empty, at least one
  step;
* **artifact** — every file the steps read exists in the public world (the environment's files where the
  Dockerfile puts them, paths the instruction or Dockerfile names, system paths) or is written by an
  earlier step;
* **compatibility** — the steps are shell commands the target harness can issue: at least one command, no
  interactive programs (editors, pagers, REPLs), nothing that needs the network the sandbox does not have;
* **leakage** — ``leakage:test_file`` (names of the task's test files), ``leakage:verifier_path``
  (``/tests``, ``/logs/verifier``, reward files, the verifier's script), ``leakage:answer`` (a literal value
  from the task's tests that appears nowhere in its public instruction or environment: a hard-coded answer),
  ``leakage:solution`` (the reference solution's path or file names). Repeating commands the agent itself
  ran is not leakage, however much they resemble the reference solution.

An optional judge (:class:`ModelJudge`: the actor, prompted) is consulted only for runbooks the rules
accept, and can only reject. :func:`screen_trajectory` applies the leakage rules that concern *actions* to
an executed trajectory: reading ``/tests``, the verifier's files or the solution.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import os
import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

from rsi_jax.env.tasks import Task, dockerfile_layout

SECTIONS = ("Goal", "Steps", "Checks")
VERIFIER_PATHS = re.compile(r"(?<![\w.\-])(/tests(?![\w.\-])|/logs/verifier|/logs/agent|reward\.(txt|json)\b"
                            r"|ctrf\.json\b|/oracle\b|/solution\b)")
SOLUTION_NAMES = ("solve.sh", "solution.sh")
SYSTEM_PREFIXES = ("/usr/", "/bin/", "/sbin/", "/lib", "/etc/", "/proc/", "/dev/", "/sys/", "/tmp/", "/var/",
                   "/opt/", "/root/", "/home/", "/run/")
READERS = {"cat", "head", "tail", "grep", "egrep", "fgrep", "wc", "sed", "awk", "sort", "uniq", "cut", "diff",
           "cmp", "jq", "python", "python3", "bash", "sh", "source", ".", "file", "stat", "md5sum", "sha256sum",
           "ls", "tar", "unzip", "zcat", "od", "xxd", "tac", "nl", "column", "csvlook", "readlink", "realpath"}
WRITERS = {"touch", "mkdir", "tee", "cp", "mv", "ln", "install"}
INTERACTIVE = {"vim", "vi", "nano", "emacs", "less", "more", "top", "htop", "watch", "ssh", "tmux", "screen",
               "man", "ipython", "mc", "nvim", "pico", "joe"}
NETWORK = re.compile(r"\b(curl|wget|git\s+clone|pip3?\s+install|uv\s+pip\s+install|apt(-get)?\s+install"
                     r"|npm\s+install|conda\s+install|docker\s+pull)\b")
REPL = {"python", "python3", "bash", "sh", "node", "irb", "psql", "mysql", "sqlite3"}
GENERIC_NAMES = {"test.sh", "run-tests.sh", "solve.sh", "solution.sh", "conftest.py"}
COMMON_LITERALS = {"utf-8", "utf8", "ascii", "latin-1", "r:gz", "w:gz", "rb", "wb", "true", "false", "none",
                   "null", "__main__", "strict", "replace", "ignore"}


@dataclasses.dataclass(frozen=True)
class Review:
  """A gate's verdict: ``accepted`` iff no rule failed; ``reasons`` are rule codes (a leakage reason is
  ``leakage:<kind>``), ``details`` say what was found, one per reason."""
  accepted: bool
  reasons: tuple[str, ...] = ()
  details: tuple[str, ...] = ()

  @classmethod
  def of(cls, found: Sequence[tuple[str, str]]) -> Review:
    seen: dict[str, str] = {}
    for code, detail in found:
      seen.setdefault(code, detail)
    return cls(not seen, tuple(seen), tuple(seen.values()))


# ------------------------------------------------------------------------------------------ public world


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
        paths.add(_join(dst, rel))
      elif rel == src:
        paths.add(dst.rstrip("/") + "/" + Path(rel).name if dst.endswith("/") else dst)
      elif rel.startswith(src + "/"):
        paths.add(_join(dst, rel[len(src) + 1:]))
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
    if _mentions(public_text, lit) or lit in with_parents or any(p.endswith(tail) for p in with_parents):
      return True
    tokens = re.findall(r"[\w.\-/]+", lit)
    small = lambda t: re.fullmatch(r"[\d./\-]+", t) and len(re.sub(r"\D", "", t).strip("0")) < 3  # noqa: E731
    return len(tokens) > 1 and all(small(t) or _mentions(public_text, t) for t in tokens)
  literals = sorted({lit for p in test_files for lit in _literals(p)
                     if lit.lower() not in COMMON_LITERALS and not public(lit)})
  sol_names = set(SOLUTION_NAMES)
  if task.solution is not None:
    sol = Path(task.solution)
    sol_names |= {p.name for p in sol.parent.iterdir() if p.is_file()} if sol.name == "solve.sh" else {sol.name}
  return TaskFacts(task.instruction, public_text, frozenset(with_parents), public_names, workdir,
                   frozenset(p.name for p in test_files) - public_names, tuple(literals),
                   frozenset(sol_names - public_names), task.test_script)


def _join(a: str, b: str) -> str:
  return (a.rstrip("/") + "/" + b) if b else a


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


def _mentions(text: str, value: str) -> bool:
  """``value`` occurs in ``text`` as a whole token (not as part of a longer word or number)."""
  if re.fullmatch(r"[\w.\-]+", value):
    return re.search(r"(?<![\w.\-])" + re.escape(value) + r"(?![\w\-]|\.\w)", text) is not None
  return value in text


# ------------------------------------------------------------------------------------------------ rules

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


def _strip_heredocs(cmd: str) -> str:
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


def _words(cmd: str) -> list[list[str]]:
  """Simple commands of a shell text (here-document bodies dropped; split at pipes, ;, &&, ||, newlines),
  each as words."""
  out = []
  for part in re.split(r"\|\||&&|[|;\n]", _strip_heredocs(cmd)):
    try:
      w = shlex.split(part, comments=True)
    except ValueError:
      w = part.split()
    if w:
      out.append(w)
  return out


def _is_path(w: str) -> bool:
  return ("/" in w or re.search(r"\.\w{1,5}$", w) is not None) and not w.startswith("-") \
      and not re.search(r"[*?$\{\}<>=\\\[\]]", w) and "://" not in w and not re.fullmatch(r"[\d.]+", w)


SCRIPT_FIRST = {"sed", "awk", "grep", "egrep", "fgrep", "jq"}  # the first operand is a script / pattern
_PRIVATE = (("/tests", "leakage:verifier_path"), ("/logs/verifier", "leakage:verifier_path"),
            ("/logs/agent", "leakage:verifier_path"), ("/solution", "leakage:solution"),
            ("/oracle", "leakage:solution"))


def _abs(w: str, cwd: str) -> str:
  return os.path.normpath(w if w.startswith("/") else _join(cwd, w))


def _operands(prog: str, args: list[str]) -> list[str]:
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


def _walk(cmds: Sequence[str], workdir: str):
  """For each simple command in order: (program, words, cwd) — ``cd`` followed."""
  cwd = workdir
  for cmd in cmds:
    for words in _words(cmd):
      prog = Path(words[0]).name
      if prog == "cd" and len(words) > 1 and "$" not in words[1]:
        cwd = _abs(words[1], cwd)
      yield prog, words, cwd, cmd


def _private_hits(cmds: Sequence[str], workdir: str) -> list[tuple[str, str]]:
  """Operands of the commands that resolve into the verifier's or the solution's folders: absolute or
  relative (``cd`` followed), with ``..``, or a glob that reaches them."""
  found = []
  for _, words, cwd, _ in _walk(cmds, workdir):
    for w in words[1:]:
      if w.startswith("-") or "://" in w or "$" in w:
        continue
      p = _abs(w, cwd)
      for prefix, kind in _PRIVATE:
        if p == prefix or p.startswith(prefix + "/") or (re.search(r"[*?\[]", p) and _glob_reaches(p, prefix)):
          found.append((kind, f"{w!r} reaches {prefix}"))
  return found


def _glob_reaches(pattern: str, prefix: str) -> bool:
  pc, qc = pattern.strip("/").split("/"), prefix.strip("/").split("/")
  return all(fnmatch.fnmatchcase(q, c) for q, c in zip(qc, pc))


def _writes(prog: str, words: list[str], cwd: str) -> set[str]:
  """Files one simple command writes: redirection targets, operands of writers and archivers, ``-o``."""
  out = {_abs(w.strip("\"'"), cwd) for w in re.findall(r">>?\s*([^\s;&|<>]+)", " ".join(words))}
  if prog in WRITERS or prog in ("tar", "zip", "gzip"):
    out |= {_abs(w, cwd) for w in words[1:] if _is_path(w)}
  if "-o" in words and words.index("-o") + 1 < len(words):
    out.add(_abs(words[words.index("-o") + 1], cwd))
  return out


def _written(cmds: Sequence[str], workdir: str) -> set[str]:
  return {p for prog, words, cwd, _ in _walk(cmds, workdir) for p in _writes(prog, words, cwd)}


def _artifact_findings(cmds: Sequence[str], facts: TaskFacts) -> list[tuple[str, str]]:
  """Files the commands read that neither the public world nor an earlier (or the same) command has."""
  found, writes = [], set()
  for prog, words, cwd, _ in _walk(cmds, facts.workdir):
    writes |= _writes(prog, words, cwd)
    if prog not in READERS:
      continue
    for w in _operands(prog, words[1:]):
      if not _is_path(w):
        continue
      p = _abs(w, cwd)
      if any(p == pre or p.startswith(pre + "/") for pre, _ in _PRIVATE):
        continue  # leakage, reported as such
      public = p in facts.public_paths or p.startswith(SYSTEM_PREFIXES) \
          or (not w.startswith("/") and Path(w).name in facts.public_names)
      if not public and not any(p == x or p.startswith(x.rstrip("/") + "/") for x in writes):
        found.append(("artifact", f"reads {p}, which the public environment does not have"))
  return found


def _compat_findings(cmds: Sequence[str], network: bool) -> list[tuple[str, str]]:
  found = []
  for c in cmds:
    simple = _words(c)
    for words in simple:
      prog = Path(words[0]).name
      if prog in INTERACTIVE:
        found.append(("compatibility", f"interactive program {prog!r} cannot run under the harness"))
      elif prog in REPL and len(words) == 1 and len(simple) == 1 and "<" not in c:
        found.append(("compatibility", f"{prog!r} without a script waits for interactive input"))
      if not network and _needs_network(prog, words):
        found.append(("compatibility", f"needs the network, which the sandbox does not have: {' '.join(words)[:80]!r}"))
  return found


def _needs_network(prog: str, words: list[str]) -> bool:
  rest = words[1:]
  if prog in ("curl", "wget"):
    return True
  if prog in ("pip", "pip3", "npm", "conda", "apt", "apt-get", "gem", "cargo", "yarn") and "install" in rest:
    return True
  if prog.startswith("python") and rest[:3] == ["-m", "pip", "install"]:
    return True
  if prog == "uv" and (rest[:2] == ["pip", "install"] or rest[:1] == ["add"]):
    return True
  return prog == "git" and bool(rest) and rest[0] in ("clone", "fetch", "pull")


def _name_findings(text: str, cmds: Sequence[str], facts: TaskFacts, who: str) -> list[tuple[str, str]]:
  """Private file names mentioned in ``text``; a generic name (``test.sh``, ``solve.sh``, ...) counts only
  where the commands do not write a file of that name themselves."""
  own = {Path(p).name for p in _written(cmds, facts.workdir)}
  found = []
  for names, kind, what in ((facts.test_names, "leakage:test_file", "test file"),
                            (facts.solution_names, "leakage:solution", "reference solution's file")):
    for n in sorted(names):
      if n in GENERIC_NAMES and n in own:
        continue
      if _mentions(text, n):
        found.append((kind, f"{who} the {what} {n}"))
  return found


def rule_findings(task: Task, runbook: str, *, network: bool = False) -> list[tuple[str, str]]:
  facts = task_facts(task)
  found: list[tuple[str, str]] = []
  secs = sections(runbook)
  for s in SECTIONS:
    if s not in secs:
      found.append(("schema", f"missing section ## {s}"))
    elif not secs[s].strip():
      found.append(("schema", f"section ## {s} is empty"))
  steps = secs.get("Steps", "")
  cmds = commands(steps)
  if "Steps" in secs and not re.search(r"^\s*([-*+]|\d+[.)])\s+\S", steps, re.MULTILINE) and not cmds:
    found.append(("schema", "## Steps lists no step"))
  if "Steps" in secs and not cmds:
    found.append(("compatibility", "no step gives a shell command"))
  all_cmds = cmds + commands(secs.get("Checks", ""))
  found += _compat_findings(all_cmds, network)
  found += _artifact_findings(all_cmds, facts)
  # leakage
  for m in VERIFIER_PATHS.finditer(runbook):
    kind = "leakage:solution" if m.group(0) in ("/oracle", "/solution") else "leakage:verifier_path"
    found.append((kind, f"names {m.group(0)}"))
  found += _private_hits(all_cmds, facts.workdir)
  if facts.test_script and facts.test_script in runbook:
    found.append(("leakage:verifier_path", f"names the verifier's script {facts.test_script}"))
  found += _name_findings(runbook, all_cmds, facts, "names")
  for lit in facts.test_literals:
    if _mentions(runbook, lit):
      found.append(("leakage:answer", f"hard-codes {lit[:60]!r}, a value of the tests found nowhere public"))
  return found


Judge = Callable[[Task, str], "Review"]


def review(task: Task, runbook: str, *, judge: Judge | None = None, network: bool = False) -> Review:
  """q(x, b): the rules above; a ``judge`` is asked only when they accept, and can only reject."""
  verdict = Review.of(rule_findings(task, runbook, network=network))
  if not verdict.accepted or judge is None:
    return verdict
  j = judge(task, runbook)
  if j.accepted:
    return verdict
  return Review(False, tuple(r if r.startswith("judge") else f"judge:{r}" for r in (j.reasons or ("judge",))),
                j.details or ("the judge rejected the runbook",))


def screen_trajectory(task: Task, transcript) -> Review:
  """q_leak(τ) on an executed trajectory: the agent's actions must not read the verifier's files
  (``/tests``, ``/logs/verifier``, reward files, test file names) or the reference solution, however the
  path is written (relative, with ``..``, a glob). ``transcript``: chat messages (``{"role", "content"}``)
  or an :class:`~rsi_jax.env.EpisodeResult`. Observations are not screened: they are what the world printed."""
  if hasattr(transcript, "messages"):
    transcript = transcript.messages()
  facts = task_facts(task)
  texts = [str(m.get("content", "")) for m in transcript if m.get("role") == "assistant"]
  cmds = [c for c in map(_action_command, texts) if c]
  found = []
  for text in texts:
    for hit in VERIFIER_PATHS.finditer(text):
      kind = "leakage:solution" if hit.group(0) in ("/oracle", "/solution") else "leakage:verifier_path"
      found.append((kind, f"the agent touched {hit.group(0)}"))
  found += _private_hits(cmds, facts.workdir)
  found += _name_findings("\n".join(texts), cmds, facts, "the agent named")
  return Review.of(found)


def _action_command(text: str) -> str | None:
  """The shell command of a reply under either action convention (None if it has none)."""
  from rsi_jax.env import actions as A
  for parse in (A.parse_json_action, A.parse_xml_action):
    try:
      return parse(text).command
    except A.ActionError:
      continue
  return None


class ModelJudge:
  """The actor as an optional reviewer: prompted (``template``: a :class:`~rsi_jax.rsr.runbook.Template`
  with ``${instruction}`` and ``${runbook}``) with the public instruction and the runbook, it answers ACCEPT
  or REJECT; anything but a leading ACCEPT rejects. Consulted only after the rules accept."""

  def __init__(self, policy, renderer, template, sampling):
    self.policy, self.renderer, self.template, self.sampling = policy, renderer, template, sampling

  def __call__(self, task: Task, runbook: str) -> Review:
    prompt = self.template.render(instruction=task.instruction.strip(), runbook=runbook.strip())
    ids = self.renderer.render([{"role": "user", "content": prompt}], add_generation_prompt=True).ids
    comp = self.policy.generate([int(i) for i in ids], self.sampling)
    text = self.renderer.decode([i for i in comp.token_ids if i not in self.renderer.eos_ids]).strip()
    if re.match(r"^\W*ACCEPT\b", text):
      return Review(True)
    return Review(False, ("judge",), (text[:200] or "no verdict",))
