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
import re
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

from rsi_jax.env.tasks import Task

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
  workdir, copies = _dockerfile_layout(dockerfile)
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
  def public(lit: str) -> bool:  # named by the public text, or a public file's path (or its tail)
    tail = "/" + lit.lstrip("/").removeprefix("./")
    return _mentions(public_text, lit) or lit in with_parents or any(p.endswith(tail) for p in with_parents)
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


def _dockerfile_layout(text: str) -> tuple[str, list[tuple[str, str]]]:
  """WORKDIR (the last one; /app if none) and (source, destination) of every COPY / ADD."""
  workdir, copies = "/app", []
  text = re.sub(r"\\\n", " ", text)
  for line in text.splitlines():
    words = line.strip().split()
    if not words:
      continue
    op = words[0].upper()
    if op == "WORKDIR" and len(words) > 1:
      workdir = words[1] if words[1].startswith("/") else _join(workdir, words[1])
    elif op in ("COPY", "ADD"):
      args = [w for w in words[1:] if not w.startswith("--")]
      if len(args) >= 2:
        dst = args[-1] if args[-1].startswith("/") else _join(workdir, args[-1])
        copies += [(s, dst if len(args) == 2 or dst.endswith("/") else dst + "/") for s in args[:-1]]
  return workdir, copies


def _literals(path: Path) -> set[str]:
  """Values a test compares against: string constants (4+ characters, not docstrings, assertion messages
  or f-string text) and numbers of 3+ significant digits."""
  text = _read_text(path)
  if path.suffix == ".py":
    try:
      tree = ast.parse(text)
    except SyntaxError:
      tree = None
    if tree is not None:
      skip = set()
      for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body \
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
          skip.add(id(node.body[0].value))
        if isinstance(node, ast.Assert) and node.msg is not None:
          skip |= {id(n) for n in ast.walk(node.msg)}
        if isinstance(node, ast.JoinedStr):
          skip |= {id(n) for n in ast.walk(node)}
      out = set()
      for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in skip or isinstance(node.value, bool):
          continue
        v = node.value
        if isinstance(v, str) and len(v.strip()) >= 4:
          out.add(v.strip())
        elif isinstance(v, (int, float)) and len(str(abs(v)).replace(".", "").strip("0")) >= 3:
          out.add(str(v))
      return out
  return {a or b for a, b in re.findall(r'"([^"\n$`]{4,})"|\'([^\'\n]{4,})\'', text)}


def _mentions(text: str, value: str) -> bool:
  """``value`` occurs in ``text`` as a whole token (not as part of a longer word or number)."""
  if re.fullmatch(r"[\w.\-]+", value):
    return re.search(r"(?<![\w.\-])" + re.escape(value) + r"(?![\w\-]|\.\w)", text) is not None
  return value in text


# ------------------------------------------------------------------------------------------------ rules


def sections(runbook: str) -> dict[str, str]:
  """``## Name`` sections of a Markdown runbook: {name: body}."""
  out, name, lines = {}, None, []
  for line in runbook.splitlines():
    m = re.match(r"^##\s+(.+?)\s*#*\s*$", line)
    if m and not line.startswith("###"):
      if name is not None:
        out[name] = "\n".join(lines).strip()
      name, lines = m.group(1).strip(), []
    elif name is not None:
      lines.append(line)
  if name is not None:
    out[name] = "\n".join(lines).strip()
  return out


def commands(text: str) -> list[str]:
  """Shell commands in Markdown: fenced code blocks and inline code spans."""
  cmds = [b.strip() for b in re.findall(r"```[\w-]*\n(.*?)```", text, re.DOTALL)]
  rest = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
  cmds += [c.strip() for c in re.findall(r"`([^`\n]+)`", rest)]
  return [c for c in cmds if c]


def _words(cmd: str) -> list[list[str]]:
  """Simple commands of a shell line (split at pipes, ;, &&, ||, newlines), each as words."""
  out = []
  for part in re.split(r"\|\||&&|[|;\n]", cmd):
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


def _reads_and_writes(cmds: Sequence[str], workdir: str) -> tuple[list[str], set[str]]:
  reads, writes = [], set()
  cwd = workdir
  absp = lambda w, c: w if w.startswith("/") else _join(c, w.removeprefix("./"))  # noqa: E731
  for cmd in cmds:
    writes |= {absp(w.strip("\"'"), cwd) for w in re.findall(r">>?\s*([^\s;&|<>]+)", cmd)}
    for words in _words(cmd):
      prog = Path(words[0]).name
      args = [w for w in words[1:]]
      if prog == "cd" and args:
        cwd = absp(args[0], cwd)
        continue
      if prog in WRITERS or prog in ("tar", "zip", "gzip"):
        writes |= {absp(w, cwd) for w in args if _is_path(w)}
      if "-o" in args and args.index("-o") + 1 < len(args):
        writes.add(absp(args[args.index("-o") + 1], cwd))
      if prog in READERS:
        for w in args:
          if w.startswith("-c") and prog.startswith("python"):
            break  # inline code follows
          if _is_path(w):
            reads.append(absp(w, cwd))
  return reads, writes


def rule_findings(task: Task, runbook: str, *, network: bool = False) -> list[tuple[str, str]]:
  facts = task_facts(task)
  found: list[tuple[str, str]] = []
  secs = {k.lower(): v for k, v in sections(runbook).items()}
  for s in SECTIONS:
    if s.lower() not in secs:
      found.append(("schema", f"missing section ## {s}"))
    elif not secs[s.lower()].strip():
      found.append(("schema", f"section ## {s} is empty"))
  steps = secs.get("steps", "")
  cmds = commands(steps)
  if "steps" in secs and not re.search(r"^\s*([-*+]|\d+[.)])\s+\S", steps, re.MULTILINE) and not cmds:
    found.append(("schema", "## Steps lists no step"))
  # compatibility with the target harness
  if "steps" in secs and not cmds:
    found.append(("compatibility", "no step gives a shell command"))
  for c in cmds:
    for words in _words(c):
      prog = Path(words[0]).name
      if prog in INTERACTIVE or (prog in REPL and len(words) == 1):
        found.append(("compatibility", f"interactive program {prog!r} cannot run under the harness"))
    if not network and NETWORK.search(c):
      found.append(("compatibility", f"needs the network, which the sandbox does not have: {c[:80]!r}"))
  # artifacts read must exist in the public world or be written by an earlier step
  reads, writes = _reads_and_writes(cmds, facts.workdir)
  for p in reads:
    if VERIFIER_PATHS.search(p):
      continue  # reported as leakage below
    public = p in facts.public_paths or p.startswith(SYSTEM_PREFIXES) or Path(p).name in facts.public_names
    if not public and not any(p == w or p.startswith(w.rstrip("/") + "/") for w in writes):
      found.append(("artifact", f"reads {p}, which the public environment does not have"))
  # leakage
  text = runbook
  for m in VERIFIER_PATHS.finditer(text):
    kind = "leakage:solution" if m.group(0) in ("/oracle", "/solution") else "leakage:verifier_path"
    found.append((kind, f"names {m.group(0)}"))
  if facts.test_script and facts.test_script in text:
    found.append(("leakage:verifier_path", f"names the verifier's script {facts.test_script}"))
  for n in sorted(facts.test_names):
    if _mentions(text, n):
      found.append(("leakage:test_file", f"names the test file {n}"))
  for n in sorted(facts.solution_names):
    if _mentions(text, n):
      found.append(("leakage:solution", f"names the reference solution's file {n}"))
  for lit in facts.test_literals:
    if _mentions(text, lit):
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
  (``/tests``, ``/logs/verifier``, reward files, test file names) or the reference solution.
  ``transcript``: chat messages (``{"role", "content"}``) or an :class:`~rsi_jax.env.EpisodeResult`."""
  if hasattr(transcript, "messages"):
    transcript = transcript.messages()
  facts = task_facts(task)
  found = []
  for m in transcript:
    if m.get("role") != "assistant":
      continue
    text = str(m.get("content", ""))
    for hit in VERIFIER_PATHS.finditer(text):
      kind = "leakage:solution" if hit.group(0) in ("/oracle", "/solution") else "leakage:verifier_path"
      found.append((kind, f"the agent touched {hit.group(0)}"))
    for n in sorted(facts.test_names):
      if _mentions(text, n):
        found.append(("leakage:test_file", f"the agent named the test file {n}"))
    for n in sorted(facts.solution_names):
      if _mentions(text, n):
        found.append(("leakage:solution", f"the agent named the reference solution's file {n}"))
  return Review.of(found)


class ModelJudge:
  """The actor as an optional reviewer: prompted with the public instruction and the runbook, it answers
  ACCEPT or REJECT; anything but a leading ACCEPT rejects. Consulted only after the rules accept."""

  def __init__(self, policy, renderer, template: str, sampling):
    self.policy, self.renderer, self.template, self.sampling = policy, renderer, template, sampling

  def __call__(self, task: Task, runbook: str) -> Review:
    prompt = self.template.format(instruction=task.instruction.strip(), runbook=runbook.strip())
    ids = self.renderer.render([{"role": "user", "content": prompt}], add_generation_prompt=True).ids
    comp = self.policy.generate([int(i) for i in ids], self.sampling)
    text = self.renderer.decode([i for i in comp.token_ids if i not in self.renderer.eos_ids]).strip()
    if re.match(r"^\W*ACCEPT\b", text):
      return Review(True)
    return Review(False, ("judge",), (text[:200] or "no verdict",))
