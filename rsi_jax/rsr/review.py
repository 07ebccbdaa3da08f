"""Judges runbooks and trajectories: the review gate q(x, b) and the leakage screen q_leak(τ) (§2.1, SPEC §5).

:func:`review` sees only what is public about a task (mined by :mod:`rsi_jax.rsr.facts`) — its instruction
and its environment (the build context and the Dockerfile) — and the runbook. It is rule-based and
deterministic; every failed rule adds a reason code (``schema``, ``artifact``, ``compatibility``,
``leakage:<kind>``) and a human-readable detail:

* **schema** — Markdown with the sections ``## Goal``, ``## Steps``, ``## Checks``, none empty, at least one
  step;
* **artifact** — every file the steps read exists in the public world (the environment's files where the
  Dockerfile puts them, paths the instruction or Dockerfile names, system paths) or is written by an
  earlier step;
* **compatibility** — the steps are shell commands the target harness can issue (in code or as bare command
  lines such as ``1. cd /app``): at least one command, no interactive programs (editors, pagers, REPLs),
  nothing that needs the network the sandbox does not have;
* **leakage** — ``leakage:test_file`` (names of the task's test files), ``leakage:verifier_path``
  (``/tests``, ``/logs/verifier``, reward files, the verifier's script), ``leakage:answer`` (a literal value
  from the task's tests that appears nowhere in its public instruction or environment: a hard-coded answer),
  ``leakage:solution`` (the reference solution's path or file names). Repeating commands the agent itself
  ran is not leakage, however much they resemble the reference solution.

An optional judge (:class:`ModelJudge`: the actor, prompted) is consulted only for runbooks the rules
accept, and can only reject. :func:`screen_trajectory` applies the leakage rules that concern *actions* to
an executed trajectory: reading ``/tests``, the verifier's files or the solution. Both read commands through
:mod:`rsi_jax.rsr.shellwords`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from rsi_jax.env.tasks import Task
from rsi_jax.rsr.facts import SYSTEM_PREFIXES, TaskFacts, mentions, task_facts
from rsi_jax.rsr.shellwords import commands, is_path, operands, resolve, sections, simple_commands, walk

SECTIONS = ("Goal", "Steps", "Checks")
VERIFIER_PATHS = re.compile(r"(?<![\w.\-])(/tests(?![\w.\-])|/logs/verifier|/logs/agent|reward\.(txt|json)\b"
                            r"|ctrf\.json\b|/oracle\b|/solution\b)")
READERS = {"cat", "head", "tail", "grep", "egrep", "fgrep", "wc", "sed", "awk", "sort", "uniq", "cut", "diff",
           "cmp", "jq", "python", "python3", "bash", "sh", "source", ".", "file", "stat", "md5sum", "sha256sum",
           "ls", "tar", "unzip", "zcat", "od", "xxd", "tac", "nl", "column", "csvlook", "readlink", "realpath"}
WRITERS = {"touch", "mkdir", "tee", "cp", "mv", "ln", "install"}
INTERACTIVE = {"vim", "vi", "nano", "emacs", "less", "more", "top", "htop", "watch", "ssh", "tmux", "screen",
               "man", "ipython", "mc", "nvim", "pico", "joe"}
REPL = {"python", "python3", "bash", "sh", "node", "irb", "psql", "mysql", "sqlite3"}
GENERIC_NAMES = {"test.sh", "run-tests.sh", "solve.sh", "solution.sh", "conftest.py"}


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


_PRIVATE = (("/tests", "leakage:verifier_path"), ("/logs/verifier", "leakage:verifier_path"),
            ("/logs/agent", "leakage:verifier_path"), ("/solution", "leakage:solution"),
            ("/oracle", "leakage:solution"))


def _private_hits(cmds: Sequence[str], workdir: str) -> list[tuple[str, str]]:
  """Operands of the commands that resolve into the verifier's or the solution's folders: absolute or
  relative (``cd`` followed), with ``..``, or a glob that reaches them."""
  found = []
  for _, words, cwd, _ in walk(cmds, workdir):
    for w in words[1:]:
      if w.startswith("-") or "://" in w or "$" in w:
        continue
      p = resolve(w, cwd)
      for prefix, kind in _PRIVATE:
        if p == prefix or p.startswith(prefix + "/") or (re.search(r"[*?\[]", p) and _glob_reaches(p, prefix)):
          found.append((kind, f"{w!r} reaches {prefix}"))
  return found


def _glob_reaches(pattern: str, prefix: str) -> bool:
  pc, qc = pattern.strip("/").split("/"), prefix.strip("/").split("/")
  return all(fnmatch.fnmatchcase(q, c) for q, c in zip(qc, pc))


def _writes(prog: str, words: list[str], cwd: str) -> set[str]:
  """Files one simple command writes: redirection targets, operands of writers and archivers, ``-o``."""
  out = {resolve(w.strip("\"'"), cwd) for w in re.findall(r">>?\s*([^\s;&|<>]+)", " ".join(words))}
  if prog in WRITERS or prog in ("tar", "zip", "gzip"):
    out |= {resolve(w, cwd) for w in words[1:] if is_path(w)}
  if "-o" in words and words.index("-o") + 1 < len(words):
    out.add(resolve(words[words.index("-o") + 1], cwd))
  return out


def _written(cmds: Sequence[str], workdir: str) -> set[str]:
  return {p for prog, words, cwd, _ in walk(cmds, workdir) for p in _writes(prog, words, cwd)}


def _artifact_findings(cmds: Sequence[str], facts: TaskFacts) -> list[tuple[str, str]]:
  """Files the commands read that neither the public world nor an earlier (or the same) command has."""
  found, writes = [], set()
  for prog, words, cwd, _ in walk(cmds, facts.workdir):
    writes |= _writes(prog, words, cwd)
    if prog not in READERS:
      continue
    for w in operands(prog, words[1:]):
      if not is_path(w):
        continue
      p = resolve(w, cwd)
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
    simple = simple_commands(c)
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
      if mentions(text, n):
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
  cmds = commands(steps, facts.programs)
  if "Steps" in secs and not re.search(r"^\s*([-*+]|\d+[.)])\s+\S", steps, re.MULTILINE) and not cmds:
    found.append(("schema", "## Steps lists no step"))
  if "Steps" in secs and not cmds:
    found.append(("compatibility", "no step gives a shell command"))
  all_cmds = cmds + commands(secs.get("Checks", ""), facts.programs)
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
    if mentions(runbook, lit):
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
