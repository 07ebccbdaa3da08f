"""Developer check of the shipped task suite under ``tasks/``: every task must build offline, its reference
solution must make every verifier check pass (reward 1), and an untouched container must fail (reward 0).

For each task folder (Harbor / Terminal-Bench 2 layout with ``task.toml``, or Terminal-Bench 1 layout with
``task.yaml``) this script:

1. lints the folder (required files, the same ``task.toml`` keys everywhere, a public instruction that names
   no test file or ``/tests`` path);
2. builds the image with the plain ``docker`` CLI, rewriting a ``FROM`` image that is not present locally
   (``ubuntu:24.04``, ``python:3.12-slim``, ``ghcr.io/laude-institute/t-bench/...``) to ``rsi-base``;
3. solved run: a fresh ``--network none`` container, copy the solution in and run it from ``/app``, then
   copy ``tests/`` to ``/tests`` and run the verifier; expect reward 1 and a CTRF report with every check
   passed;
4. untouched run: a fresh container, run only the verifier; expect reward 0;
5. partial run, where the task has ``solution/partial.sh`` (a deliberately incomplete solution kept for
   reward tests): expect reward 0 with some but not all checks passed.

It prints one table row per task (family, checks, passed checks in both runs, verifier seconds) and exits
non-zero when any task misbehaves. The env part's own tests exercise the same tasks through the real
loader / sandbox / harness; this is the quick standalone check used while writing tasks.

Usage: ``python scripts/validate_tasks.py [--tasks-dir tasks] [--base rsi-base] [--lint-only] [NAME ...]``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

HARBOR_FILES = ("instruction.md", "task.toml", "environment/Dockerfile", "tests/test.sh",
                "tests/test_outputs.py", "solution/solve.sh")
TB1_FILES = ("task.yaml", "Dockerfile", "docker-compose.yaml", "run-tests.sh", "tests/test_outputs.py",
             "solution.sh")
# The Harbor keys every shipped task.toml carries (tables -> keys); upstream-format tasks may add more.
TOML_KEYS = {
  "": {"version"},
  "metadata": {"author_name", "difficulty", "category", "tags"},
  "verifier": {"timeout_sec"},
  "agent": {"timeout_sec"},
  "environment": {"build_timeout_sec", "cpus", "memory", "storage"},
}
DIFFICULTIES = {"easy", "medium", "hard"}
# What a public instruction must never reveal: the verifier's location or its file names.
LEAK_PATTERNS = (re.compile(r"/tests\b"), re.compile(r"test_outputs"), re.compile(r"\btest\.sh\b"),
                 re.compile(r"ctrf", re.I), re.compile(r"reward\.txt"))


@dataclass
class Result:
  name: str
  family: str = "?"
  layout: str = "?"
  problems: list[str] = field(default_factory=list)
  checks: int = 0
  solved_passed: int = -1
  solved_reward: str = "-"
  noop_passed: int = -1
  noop_reward: str = "-"
  partial_passed: int = -1
  partial_reward: str = "-"
  verify_s: float = 0.0

  @property
  def ok(self) -> bool:
    return not self.problems


def sh(args: list[str], *, input_text: str | None = None, timeout: float = 600.0,
       check: bool = False) -> subprocess.CompletedProcess:
  """Runs a command, capturing text output; raises on a non-zero status only when ``check``."""
  proc = subprocess.run(args, input=input_text, capture_output=True, text=True, timeout=timeout)
  if check and proc.returncode != 0:
    raise RuntimeError(f"{' '.join(args[:4])}... failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
  return proc


def image_exists(name: str) -> bool:
  return sh(["docker", "image", "inspect", name]).returncode == 0


def rewrite_from(dockerfile: str, base: str) -> str:
  """Maps every ``FROM`` image that is not present locally (and is not an earlier build stage) to ``base``;
  ``rsi-base`` itself also maps to ``base`` so a candidate base image can be tried under another name."""
  stages: set[str] = set()
  out = []
  for line in dockerfile.splitlines():
    m = re.match(r"^(\s*FROM\s+)(?:--platform=\S+\s+)?(\S+)(\s+AS\s+(\S+))?(.*)$", line, re.I)
    if m:
      image = m.group(2)
      if image not in stages and (image.split(":")[0] == "rsi-base" or not image_exists(image)):
        line = f"{m.group(1)}{base}{m.group(3) or ''}{m.group(5)}"
      if m.group(4):
        stages.add(m.group(4))
    out.append(line)
  return "\n".join(out) + "\n"


def lint(task: Path, res: Result) -> None:
  """Static checks of one task folder; appends human-readable problems to ``res``."""
  files = HARBOR_FILES if res.layout == "harbor" else TB1_FILES
  for rel in files:
    if not (task / rel).is_file():
      res.problems.append(f"missing {rel}")
  if res.layout == "harbor":
    meta = tomllib.loads((task / "task.toml").read_text())
    for table, keys in TOML_KEYS.items():
      section = meta if not table else meta.get(table, {})
      missing = keys - set(section)
      if missing:
        res.problems.append(f"task.toml [{table or 'top'}] lacks {sorted(missing)}")
    res.family = meta.get("metadata", {}).get("category", "?")
    if meta.get("metadata", {}).get("difficulty") not in DIFFICULTIES:
      res.problems.append("task.toml difficulty not easy/medium/hard")
    instruction = (task / "instruction.md").read_text()
  else:
    text = (task / "task.yaml").read_text()
    m = re.search(r"^category:\s*(\S+)", text, re.M)
    res.family = m.group(1) if m else "?"
    for key in ("instruction:", "parser_name: pytest", "max_agent_timeout_sec:", "max_test_timeout_sec:",
                "run_tests_in_same_shell: false"):
      if key not in text:
        res.problems.append(f"task.yaml lacks {key!r}")
    instruction = text.split("author_", 1)[0]
  for pat in LEAK_PATTERNS:
    if pat.search(instruction):
      res.problems.append(f"instruction leaks {pat.pattern!r}")


def build(task: Path, res: Result, base: str) -> str:
  """Builds the task image offline-style (FROM mapped to ``base``) and returns its tag."""
  if res.layout == "harbor":
    context, dockerfile = task / "environment", task / "environment" / "Dockerfile"
  else:
    context, dockerfile = task, task / "Dockerfile"
  tag = f"rsi-task-{task.name}"
  text = rewrite_from(dockerfile.read_text(), base)
  sh(["docker", "build", "-q", "-t", tag, "-f", "-", str(context)], input_text=text, timeout=900, check=True)
  return tag


def run_case(tag: str, task: Path, res: Result, *, solve: str | None) -> tuple[str, dict | None, float]:
  """One fresh ``--network none`` container: optionally a solution script (``solve.sh`` or another file
  of ``solution/``), then the verifier.

  Returns (reward text, parsed CTRF report or None, verifier wall seconds).
  """
  name = f"rsi-validate-{task.name}-{(solve or 'noop').split('.')[0]}"
  sh(["docker", "rm", "-f", name])
  sh(["docker", "run", "-d", "--network", "none", "--name", name, tag, "sleep", "infinity"], check=True)
  try:
    if solve:
      if res.layout == "harbor":
        sh(["docker", "cp", f"{task / 'solution'}/.", f"{name}:/solution"], check=True)
        script = f"/solution/{solve}"
      else:
        sh(["docker", "cp", str(task / "solution.sh"), f"{name}:/tmp/solution.sh"], check=True)
        script = "/tmp/solution.sh"
      proc = sh(["docker", "exec", "-w", "/app", name, "bash", script], timeout=300)
      if proc.returncode != 0:
        res.problems.append(f"solution exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    sh(["docker", "cp", f"{task / 'tests'}/.", f"{name}:/tests"], check=True)
    t0 = time.perf_counter()
    if res.layout == "harbor":
      proc = sh(["docker", "exec", "-w", "/app", name, "bash", "/tests/test.sh"], timeout=300)
      reward = sh(["docker", "exec", name, "cat", "/logs/verifier/reward.txt"]).stdout.strip() or "?"
    else:
      # TB1 parses pytest's output; the CTRF file comes from PYTEST_ADDOPTS so run-tests.sh stays as shipped.
      sh(["docker", "cp", str(task / "run-tests.sh"), f"{name}:/tests/run-tests.sh"], check=True)
      sh(["docker", "exec", name, "mkdir", "-p", "/logs/verifier"], check=True)
      proc = sh(["docker", "exec", "-w", "/app", "-e", "TEST_DIR=/tests", "-e",
                 "PYTEST_ADDOPTS=--ctrf /logs/verifier/ctrf.json", name, "bash", "/tests/run-tests.sh"],
                timeout=300)
      reward = "1" if proc.returncode == 0 else "0"
    elapsed = time.perf_counter() - t0
    raw = sh(["docker", "exec", name, "cat", "/logs/verifier/ctrf.json"]).stdout
    try:
      report = json.loads(raw)
    except json.JSONDecodeError:
      report = None
    return reward, report, elapsed
  finally:
    sh(["docker", "rm", "-f", name])


def summary(report: dict | None) -> tuple[int, int]:
  """(passed, total) from a CTRF report; (-1, -1) when there is none."""
  if not report:
    return -1, -1
  s = report.get("results", {}).get("summary", {})
  return int(s.get("passed", -1)), int(s.get("tests", -1))


def validate(task: Path, base: str) -> Result:
  res = Result(task.name, layout="harbor" if (task / "task.toml").is_file() else "tb1")
  lint(task, res)
  if res.problems:
    return res
  try:
    tag = build(task, res, base)
    reward, report, secs = run_case(tag, task, res, solve="solve.sh")
    res.solved_reward, res.verify_s = reward, secs
    res.solved_passed, res.checks = summary(report)
    if reward != "1":
      res.problems.append(f"solved run reward {reward}")
    if res.checks <= 0 or res.solved_passed != res.checks:
      res.problems.append(f"solved run passed {res.solved_passed}/{res.checks}")
    if secs > 10.0:
      res.problems.append(f"verifier took {secs:.1f}s (> 10 s)")
    reward, report, _ = run_case(tag, task, res, solve=None)
    res.noop_reward = reward
    res.noop_passed, total = summary(report)
    if reward != "0":
      res.problems.append(f"untouched run reward {reward}")
    if total != res.checks:
      res.problems.append(f"untouched run collected {total} checks, solved run {res.checks}")
    if (task / "solution" / "partial.sh").is_file():
      reward, report, _ = run_case(tag, task, res, solve="partial.sh")
      res.partial_reward = reward
      res.partial_passed, total = summary(report)
      if reward != "0" or not 0 < res.partial_passed < res.checks or total != res.checks:
        res.problems.append(f"partial run reward {reward} passed {res.partial_passed}/{total}")
  except (RuntimeError, subprocess.TimeoutExpired) as e:
    res.problems.append(str(e)[-500:])
  return res


def task_dirs(tasks_dir: Path, names: list[str]) -> list[Path]:
  tasks = sorted(p for p in tasks_dir.iterdir()
                 if p.is_dir() and ((p / "task.toml").is_file() or (p / "task.yaml").is_file()))
  return [p for p in tasks if p.name in set(names)] if names else tasks


def lint_all(tasks_dir: Path, names: list[str]) -> int:
  """Static checks of every task (no Docker): files, keys, leaks, and that the test files compile."""
  bad = 0
  for task in task_dirs(tasks_dir, names):
    res = Result(task.name, layout="harbor" if (task / "task.toml").is_file() else "tb1")
    lint(task, res)
    test_file = task / "tests" / "test_outputs.py"
    if test_file.is_file():
      try:
        compile(test_file.read_text(), str(test_file), "exec")
      except SyntaxError as e:
        res.problems.append(f"tests/test_outputs.py does not compile: {e}")
    bad += not res.ok
    print(f"{res.name:40s} {res.family:22s} {res.layout:6s} " + ("ok" if res.ok else "; ".join(res.problems)))
  return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("names", nargs="*", help="task folder names (default: all)")
  ap.add_argument("--tasks-dir", type=Path, default=REPO_ROOT / "tasks")
  ap.add_argument("--base", default="rsi-base", help="local image that unknown FROM images map to")
  ap.add_argument("--lint-only", action="store_true", help="static checks only (no Docker)")
  args = ap.parse_args(argv)
  if args.lint_only:
    return lint_all(args.tasks_dir, args.names)
  if not image_exists(args.base):
    print(f"base image {args.base!r} is missing (scripts/build_base_image.sh builds it)", file=sys.stderr)
    return 2
  tasks = task_dirs(args.tasks_dir, args.names)
  header = (f"{'task':40s} {'family':22s} {'layout':6s} {'checks':>6s} {'solved':>9s} {'untouched':>9s} "
            f"{'partial':>9s} {'verify_s':>8s}")
  print(header)
  print("-" * len(header))
  results = []
  for task in tasks:
    res = validate(task, args.base)
    results.append(res)
    solved = f"{res.solved_reward}:{res.solved_passed}/{res.checks}"
    noop = f"{res.noop_reward}:{res.noop_passed}/{res.checks}"
    partial = f"{res.partial_reward}:{res.partial_passed}/{res.checks}" if res.partial_passed >= 0 else "-"
    print(f"{res.name:40s} {res.family:22s} {res.layout:6s} {res.checks:6d} {solved:>9s} {noop:>9s} "
          f"{partial:>9s} {res.verify_s:8.2f}" + ("" if res.ok else "  FAIL: " + "; ".join(res.problems)), flush=True)
  families: dict[str, list[int]] = {}
  for res in results:
    families.setdefault(res.family, []).append(res.checks)
  print("\nchecks per family: " + ", ".join(f"{f}={sorted(c)}" for f, c in sorted(families.items())))
  bad = [r.name for r in results if not r.ok]
  print(f"{len(results) - len(bad)}/{len(results)} tasks valid" + (f"; failing: {bad}" if bad else ""))
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
