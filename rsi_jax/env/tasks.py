"""Terminal task loading: Harbor / TB2 and TB1 task folders and suites of them, read unchanged (SPEC §6).

Harbor / TB2 layout (``task.toml`` marks it)::

    <task>/instruction.md            public instruction shown to the agent
    <task>/task.toml                 [metadata] difficulty, category, tags; [verifier] timeout_sec;
                                     [agent] timeout_sec; [environment] cpus, memory ("2G"), storage, ...
    <task>/environment/Dockerfile    build context = environment/
    <task>/tests/test.sh             protected verifier (+ test files); copied to /tests after the agent
    <task>/solution/solve.sh         reference solution

Terminal-Bench 1 layout (``task.yaml`` marks it)::

    <task>/task.yaml                 instruction, difficulty, category, tags, max_agent_timeout_sec,
                                     max_test_timeout_sec, parser_name, ...
    <task>/Dockerfile                build context = the task folder (minus tests and solution)
    <task>/run-tests.sh, tests/      copied together to /tests after the agent (TEST_DIR=/tests)
    <task>/solution.sh               reference solution

Base images and the ``FROM`` lines of a task's Dockerfile are read by :mod:`rsi_jax.env.dockerfiles`; the folder's
tree (names, kinds of entry, symbolic links) is checked by :mod:`rsi_jax.env.task_tree`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import logging
import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from rsi_jax.env.dockerfiles import dockerfile_images, dockerfile_layout
from rsi_jax.env.task_tree import is_utf8, show_name, tree_problems
from rsi_jax.units import parse_memory

log = logging.getLogger(__name__)

LAYOUT_HARBOR = "harbor"
LAYOUT_TB1 = "tb1"
DEFAULT_AGENT_TIMEOUT_S = 900.0
DEFAULT_VERIFIER_TIMEOUT_S = 300.0
DEFAULT_BUILD_TIMEOUT_S = 600.0
DEFAULT_MEMORY = "2G"
DEFAULT_CPUS = 1.0
# Files of a TB1 task folder that never enter its build context (the agent must not find them in the image).
TB1_PRIVATE = ("tests", "solution.sh", "run-tests.sh", "task.yaml", "docker-compose.yaml",
               "docker-compose.yml")


class TaskError(ValueError):
  """A task folder that cannot be used. The message names the folder, then every reason (file and, where it
  applies, field), separated by "; "; ``reason`` is that list without the folder."""

  def __init__(self, message: str, reason: str | None = None):
    super().__init__(message)
    self.reason = message if reason is None else reason


@dataclasses.dataclass(frozen=True)
class Refusal:
  """A folder of a suite that was not loaded: its name and why (one line)."""
  task: str
  reason: str

  def to_dict(self) -> dict:
    return {"task": self.task, "reason": self.reason}


@dataclasses.dataclass
class Suite:
  """What :func:`load_suite` made of a folder of task folders: every folder is in ``tasks`` or ``refused``;
  ``notes``: what was adjusted on the way (a task named twice)."""
  tasks: list
  refused: list = dataclasses.field(default_factory=list)
  notes: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Task:
  """One terminal task, as loaded from its folder."""
  name: str  # folder name, unique within a suite
  path: Path
  layout: str  # LAYOUT_HARBOR | LAYOUT_TB1
  instruction: str
  family: str  # metadata category; the reward's family f
  difficulty: str
  tags: tuple[str, ...]
  agent_timeout_s: float
  verifier_timeout_s: float
  build_timeout_s: float
  cpus: float
  memory_bytes: int
  pids_limit: int | None  # None: the run's default (env.pids_limit)
  dockerfile: Path
  context_dir: Path  # docker build context
  context_exclude: tuple[str, ...]  # top-level names of context_dir left out of the build
  tests_dir: Path  # copied to /tests after the agent finishes
  test_script: str  # path inside the container the verifier runs with bash
  solution: Path | None  # reference solution script (None if the task ships none)
  extra_test_files: tuple[Path, ...] = ()  # copied to /tests beside tests_dir's content (TB1 run-tests.sh)
  storage_bytes: int | None = None  # environment.storage: what the container may write (None: env.disk_limit)
  allow_internet: bool = False  # environment.allow_internet: the task needs the network while it runs
  verifier_env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # [verifier.env]
  private_in_image: tuple[str, ...] = ()  # container paths of private files the build copied: deleted first
  # container path -> the task-folder file the build copied there (each of private_in_image): what the
  # verifier puts back before the tests run, as TB1's harness leaves the image
  private_origin: Mapping[str, Path] = dataclasses.field(default_factory=dict)
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the raw metadata file

  def summary(self) -> dict:
    return {"name": self.name, "layout": self.layout, "family": self.family, "difficulty": self.difficulty}


# ---------------------------------------------------------------------------------------------- loading


def load_task(path: str | Path, images: Callable[[str], str | None] | None = None) -> Task:
  """Load one task folder (layout detected from ``task.toml`` / ``task.yaml``).

  A task folder is untrusted input: it is refused (:class:`TaskError` naming every reason, not only the first)
  for a symbolic link that leaves the folder (absolute, through ``..`` or through a chain of links) or leads
  nowhere, a name that is not UTF-8, a file that is neither a regular file, a folder nor a link, a malformed
  metadata file or field, a missing file, an unsupported TB1 parser, and, given ``images`` (a check of one
  ``FROM`` reference, e.g. :func:`rsi_jax.env.dockerfiles.image_check`), each base image it refuses. A folder
  with a link that leaves it is not read any further."""
  path = Path(path)
  if not path.is_dir():
    raise TaskError(f"{show_name(str(path))}: not a task folder", "not a task folder")
  path = path.resolve()
  errors = [f"folder name is not UTF-8: {show_name(path.name)}"] if not is_utf8(path.name) else []
  links = tree_problems(path, errors)
  if links:
    _raise(path, errors)
  if (path / "task.toml").is_file():
    loader, dockerfile = _load_harbor, path / "environment" / "Dockerfile"
  elif (path / "task.yaml").is_file():
    loader, dockerfile = _load_tb1, path / "Dockerfile"
  else:
    near = sorted(p.name for p in path.iterdir() if p.name.lower() in ("task.toml", "task.yaml"))
    errors += ([f"{n}: the metadata file must be named {n.lower()} (names are case-sensitive)" for n in near]
               or ["neither task.toml (Harbor / Terminal-Bench 2) nor task.yaml (Terminal-Bench 1)"])
    _raise(path, errors)
  check = _Checks(errors)
  task = loader(path, check)
  if images is not None and dockerfile.is_file():
    errors += [why for image in dockerfile_images(dockerfile.read_text(errors="replace"))
               if (why := images(image))]
  if errors or task is None:
    _raise(path, errors)
  return task


def load_suite(tasks_dir: str | Path, names: list[str] | tuple[str, ...] | None = None, pattern: str = "*", *,
               strict: bool = False, images: Callable[[str], str | None] | None = None) -> Suite:
  """Every folder of ``tasks_dir`` (sorted by name; hidden ones, ``.*``, left aside), or the named ones, or those
  matching a glob: each loaded (:func:`load_task`) or refused with its reason. A name given twice is loaded once
  (a note says so). ``strict``: the first refused folder raises its :class:`TaskError` instead."""
  root = Path(tasks_dir)
  if not root.is_dir():
    raise TaskError(f"{root}: tasks directory does not exist")
  notes: list[str] = []
  if names:
    entries = list(dict.fromkeys(names))
    notes += [f"task {n} is named {list(names).count(n)} times: evaluated once" for n in entries
              if list(names).count(n) > 1]
  else:
    entries = sorted(d.name for d in root.iterdir()
                     if (d.is_dir() or d.is_symlink()) and not d.name.startswith(".")
                     and fnmatch.fnmatch(d.name, pattern))
    if not entries and pattern == "*":
      raise TaskError(f"{root}: no task folder (a folder with task.toml or task.yaml) in it")
  suite = Suite([], [], notes)
  for name in entries:
    try:
      if not name or name in (".", "..") or "/" in name or os.sep in name:
        raise TaskError(f"{root}: {name!r} is not the name of a folder in it", "not a folder name of the suite")
      if not (root / name).is_dir():
        raise TaskError(f"{root / show_name(name)}: no such task folder in {root}", f"no such task folder in {root}")
      suite.tasks.append(load_task(root / name, images))
    except TaskError as e:
      if strict:
        raise
      suite.refused.append(Refusal(show_name(name), e.reason))
  return suite


def load_tasks(tasks_dir: str | Path, names: list[str] | tuple[str, ...] | None = None,
               pattern: str = "*") -> list[Task]:
  """The tasks of :func:`load_suite`, stopping at the first refused folder (its :class:`TaskError`)."""
  return load_suite(tasks_dir, names, pattern, strict=True).tasks


def _raise(path: Path, errors: list[str]):
  """The refusal of the folder ``path``: every reason, paths inside it given relative to it."""
  reason = " ".join("; ".join(e.replace(f"{path}/", "") for e in errors).split())  # one line
  raise TaskError(f"{show_name(str(path))}: {reason}", reason)


class _Checks:
  """Runs one field or file check; a :class:`TaskError` is kept (every reason is reported) and ``default``
  stands in for the value."""

  def __init__(self, errors: list[str]):
    self.errors = errors

  def __call__(self, default, fn: Callable[[], Any]):
    try:
      return fn()
    except TaskError as e:
      self.errors.append(str(e))
      return default


def _parse_toml(f: Path) -> dict:
  try:
    return tomllib.loads(_read_utf8(f))
  except tomllib.TOMLDecodeError as e:
    raise TaskError(f"{f}: invalid TOML: {e}") from None


def _load_harbor(path: Path, check: _Checks) -> Task | None:
  f = path / "task.toml"
  meta = check({}, lambda: _parse_toml(f))
  md = check({}, lambda: _section(meta, "metadata", f))
  ver = check({}, lambda: _section(meta, "verifier", f))
  agent = check({}, lambda: _section(meta, "agent", f))
  envs = check({}, lambda: _section(meta, "environment", f))
  instruction = check("", lambda: _read_required(path / "instruction.md"))
  dockerfile = check(None, lambda: _require_file(path / "environment" / "Dockerfile"))
  tests = path / "tests"
  check(None, lambda: _require_file(tests / "test.sh"))
  solution = path / "solution" / "solve.sh"
  fields = dict(
      family=check("", lambda: _str(md, "category", f, "metadata.category", default="default")),
      difficulty=check("", lambda: _str(md, "difficulty", f, "metadata.difficulty", default="unknown")),
      tags=check((), lambda: _tags(md.get("tags", ()), f, "metadata.tags")),
      agent_timeout_s=check(0.0, lambda: _pos(agent, "timeout_sec", f, "agent.timeout_sec", DEFAULT_AGENT_TIMEOUT_S)),
      verifier_timeout_s=check(0.0, lambda: _pos(ver, "timeout_sec", f, "verifier.timeout_sec",
                                                 DEFAULT_VERIFIER_TIMEOUT_S)),
      build_timeout_s=check(0.0, lambda: _pos(envs, "build_timeout_sec", f, "environment.build_timeout_sec",
                                              DEFAULT_BUILD_TIMEOUT_S)),
      cpus=check(0.0, lambda: _pos(envs, "cpus", f, "environment.cpus", DEFAULT_CPUS)),
      memory_bytes=check(0, lambda: _memory(envs.get("memory", envs.get("memory_mb")), f, "environment.memory")),
      pids_limit=check(None, lambda: int(_pos(envs, "pids", f, "environment.pids", 1)) if "pids" in envs else None),
      storage_bytes=check(None, lambda: _memory(envs.get("storage", envs.get("storage_mb")), f, "environment.storage")
                          if "storage" in envs or "storage_mb" in envs else None),
      allow_internet=check(False, lambda: _bool(envs, "allow_internet", f, "environment.allow_internet")),
      verifier_env=check({}, lambda: _str_table(ver.get("env", {}), f, "verifier.env")))
  if check.errors:
    return None
  return Task(
      name=path.name, path=path, layout=LAYOUT_HARBOR, instruction=instruction, dockerfile=dockerfile,
      context_dir=path / "environment", context_exclude=(), tests_dir=tests, test_script="/tests/test.sh",
      solution=solution if solution.is_file() else None, metadata=meta, **fields)


def _parse_yaml(f: Path) -> dict:
  try:
    meta = yaml.safe_load(_read_utf8(f))
  except yaml.YAMLError as e:
    raise TaskError(f"{f}: invalid YAML: {e}") from None
  if not isinstance(meta, dict):
    raise TaskError(f"{f}: top level must be a mapping, got {type(meta).__name__}")
  return meta


def _tb1_instruction(meta: Mapping, f: Path) -> str:
  instruction = meta.get("instruction")
  if instruction is None and isinstance(meta.get("descriptions"), list) and meta["descriptions"]:
    instruction = (meta["descriptions"][0] or {}).get("description")  # the oldest TB1 variant
  if not isinstance(instruction, str) or not instruction.strip():
    raise TaskError(f"{f}: field 'instruction' is missing or empty")
  return instruction


def _tb1_parser(meta: Mapping, f: Path):
  parser = meta.get("parser_name", "pytest")
  if parser != "pytest":
    raise TaskError(f"{f}: field 'parser_name' is {parser!r}; only 'pytest' is supported")


def _load_tb1(path: Path, check: _Checks) -> Task | None:
  f = path / "task.yaml"
  meta = check(None, lambda: _parse_yaml(f))
  instruction = "" if meta is None else check("", lambda: _tb1_instruction(meta, f))
  meta = meta or {}
  dockerfile = check(None, lambda: _require_file(path / "Dockerfile"))
  run_tests = check(None, lambda: _require_file(path / "run-tests.sh"))
  tests = path / "tests"
  if not tests.is_dir():
    check.errors.append(f"{tests}: missing tests folder")
  solution = path / "solution.sh"
  check(None, lambda: _tb1_parser(meta, f))
  fields = dict(
      family=check("", lambda: _str(meta, "category", f, "category", default="default")),
      difficulty=check("", lambda: _str(meta, "difficulty", f, "difficulty", default="unknown")),
      tags=check((), lambda: _tags(meta.get("tags", ()), f, "tags")),
      agent_timeout_s=check(0.0, lambda: _pos(meta, "max_agent_timeout_sec", f, "max_agent_timeout_sec",
                                              DEFAULT_AGENT_TIMEOUT_S)),
      verifier_timeout_s=check(0.0, lambda: _pos(meta, "max_test_timeout_sec", f, "max_test_timeout_sec",
                                                 DEFAULT_VERIFIER_TIMEOUT_S)))
  if check.errors:
    return None
  # Private files the Dockerfile names in a COPY stay in the build context (the build needs them) and are
  # deleted from the container before the agent starts; otherwise (e.g. "COPY . /app") they never enter it.
  _, copies = dockerfile_layout(dockerfile.read_text(errors="replace"))
  needed, origin = set(), {}
  for src, dst in copies:
    name = src.strip("/").removeprefix("./")
    if name not in TB1_PRIVATE or not (path / name).exists():
      continue
    needed.add(name)
    if (path / name).is_dir():  # a folder's content lands in the destination: delete those files only
      origin |= {dst.rstrip("/") + "/" + f.relative_to(path / name).as_posix(): f
                 for f in sorted((path / name).rglob("*")) if f.is_file()}
    else:
      origin[dst.rstrip("/") + "/" + name if dst.endswith("/") else dst] = path / name
  hidden = sorted(origin)
  return Task(
      name=path.name, path=path, layout=LAYOUT_TB1, instruction=instruction, **fields,
      build_timeout_s=DEFAULT_BUILD_TIMEOUT_S, cpus=DEFAULT_CPUS,
      memory_bytes=_memory(None, f, "memory"), pids_limit=None,
      dockerfile=dockerfile, context_dir=path, context_exclude=tuple(p for p in TB1_PRIVATE if p not in needed),
      tests_dir=tests, test_script="/tests/run-tests.sh", extra_test_files=(run_tests,),
      solution=solution if solution.is_file() else None, metadata=meta, private_in_image=tuple(hidden),
      private_origin={k: origin[k] for k in hidden})


# ----------------------------------------------------------------------------------------------- fields


def _section(meta: Mapping, name: str, f: Path) -> Mapping:
  s = meta.get(name, {})
  if not isinstance(s, Mapping):
    raise TaskError(f"{f}: field '{name}' must be a table, got {type(s).__name__}")
  return s


def _bool(d: Mapping, key: str, f: Path, field: str, default: bool = False) -> bool:
  v = d.get(key, default)
  if not isinstance(v, bool):
    raise TaskError(f"{f}: field '{field}' must be true or false, got {v!r}")
  return v


def _str_table(v, f: Path, field: str) -> dict[str, str]:
  if not isinstance(v, Mapping) or not all(isinstance(k, str) and isinstance(x, (str, int, float))
                                           and not isinstance(x, bool) for k, x in v.items()):
    raise TaskError(f"{f}: field '{field}' must be a table of names to strings, got {v!r}")
  return {k: str(x) for k, x in v.items()}


def _read_required(p: Path) -> str:
  if not p.is_file():
    raise TaskError(f"{p}: missing file")
  text = _read_utf8(p)
  if not text.strip():
    raise TaskError(f"{p}: file is empty")
  return text


def _read_utf8(p: Path) -> str:
  try:
    return p.read_bytes().decode("utf-8")
  except UnicodeDecodeError as e:
    raise TaskError(f"{p}: not UTF-8 text (byte {e.start}: {e.reason})") from None
  except OSError as e:
    raise TaskError(f"{p}: cannot read: {e.strerror}") from None


def _require_file(p: Path) -> Path:
  if not p.is_file():
    raise TaskError(f"{p}: missing file")
  return p


def _str(m: Mapping, k: str, f: Path, field: str, default: str) -> str:
  v = m.get(k, default)
  if not isinstance(v, str) or not v:
    raise TaskError(f"{f}: field '{field}' must be a non-empty string, got {v!r}")
  return v


def _tags(v, f: Path, field: str) -> tuple[str, ...]:
  if isinstance(v, str):
    v = [v]
  if not isinstance(v, (list, tuple)) or not all(isinstance(t, str) for t in v):
    raise TaskError(f"{f}: field '{field}' must be a list of strings, got {v!r}")
  return tuple(v)


def _pos(m: Mapping, k: str, f: Path, field: str, default: float) -> float:
  v = m.get(k, default)
  if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
    raise TaskError(f"{f}: field '{field}' must be a positive number, got {v!r}")
  return float(v)


def _memory(v, f: Path, field: str) -> int:
  try:
    b = parse_memory(DEFAULT_MEMORY if v is None else v)
  except ValueError:
    raise TaskError(f"{f}: field '{field}' must be a size such as \"2G\", got {v!r}") from None
  if b < 16 * 2**20:
    raise TaskError(f"{f}: field '{field}' is below 16M ({v!r})")
  return b


def tasks_digest(tasks) -> str:
  """Which tasks (by name, in order): a changed task pool changes it."""
  return hashlib.sha256("\n".join(t.name for t in tasks).encode()).hexdigest()[:16]
