"""A task's verifier script read without running it: its commands, where each runs, the files they name.

The script is followed as the shell would run it, statically: the tests folder's scripts it sources or calls
are expanded in place (recursively, each once), ``cd`` moves the working directory (the image's ``WORKDIR`` to
start with), and a container path is traced to the host file that will be there when the tests run (the tests
folder, or the build context through the Dockerfile's ``COPY`` / ``ADD``). :mod:`rsi_jax.env.verifier_deps`
reads what the script installs from these commands.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
import shlex
from pathlib import Path

from rsi_jax.env.dockerfiles import dockerfile_layout


def _commands(text: str) -> list[list[str]]:
  """The commands of shell text, as words: lines joined at ``\\``, comments left out, split at ``;``, ``|``,
  ``&&`` and ``||``, leading ``VAR=value`` assignments dropped."""
  text = re.sub(r"\\\n", " ", text)
  out = []
  for line in text.splitlines():
    line = line.strip()
    if not line or line.startswith("#"):
      continue
    for part in re.split(r"\|\||&&|[|;]", line):
      try:
        words = shlex.split(part, comments=True)
      except ValueError:
        words = part.split()
      while words and re.fullmatch(r"\w+=\S*", words[0]):  # VAR=value prefixes
        words = words[1:]
      if words:
        out.append(words)
  return out


def tests_folder_files(task) -> dict[str, Path]:
  """What the verifier copies to /tests: {path relative to /tests: host file} (a link leaving the tests folder
  is left out)."""
  tests = Path(task.tests_dir)
  out = {}
  if tests.is_dir():
    root = tests.resolve()
    for p in sorted(tests.rglob("*")):
      if p.is_file() and p.resolve().is_relative_to(root):
        out[p.relative_to(tests).as_posix()] = p
  for p in task.extra_test_files:
    if Path(p).is_file():
      out[Path(p).name] = Path(p)
  return out


_TEST_DIR_VARS = ("$TEST_DIR", "${TEST_DIR}")


def container_path(word: str, cwd: str) -> str | None:
  """The container path a script's argument names, run in ``cwd`` (``$TEST_DIR`` is /tests, ``~`` and
  ``$HOME`` root's home); None where it depends on other variables."""
  for var, value in [*((v, "/tests") for v in _TEST_DIR_VARS), ("$HOME", "/root"), ("${HOME}", "/root"),
                     ("~", "/root")]:
    if word == var or word.startswith(var + "/"):
      word = value + word[len(var):]
      break
  if "$" in word or "`" in word:
    return None
  return posixpath.normpath(posixpath.join(cwd, word))


def _tests_script(word: str, files: dict[str, Path], bare: bool) -> str | None:
  """The tests-folder script (its path relative to /tests) that ``word`` names: ``$TEST_DIR/x.sh``,
  ``${TEST_DIR}/x.sh``, ``/tests/x.sh``, ``./x.sh`` or, with ``bare``, ``x.sh``; None if it is not there."""
  for prefix in (*(v + "/" for v in _TEST_DIR_VARS), "/tests/", "./"):
    if word.startswith(prefix):
      rel = word[len(prefix):]
      break
  else:
    rel = word if bare and "/" not in word else None
  if not rel:
    return None
  rel = posixpath.normpath(rel)
  return rel if rel in files else None


def _cd(cwd: str, args: list[str]) -> str:
  target = next((a for a in args if not a.startswith("-") or a == "-"), "~")
  if target == "-":
    return cwd
  return container_path(target, cwd) or cwd


def image_workdir(task) -> str:
  """The working directory the verifier script starts in: the Dockerfile's ``WORKDIR`` (``/`` without one)."""
  text = Path(task.dockerfile).read_text(errors="replace") if Path(task.dockerfile).is_file() else ""
  if not re.search(r"^\s*WORKDIR\s", text, re.IGNORECASE | re.MULTILINE):
    return "/"
  return dockerfile_layout(text)[0]


def script_commands(task) -> list[tuple[list[str], str]]:
  """The verifier script's commands, each with the working directory it runs in (the image's WORKDIR,
  followed through ``cd``), with the tests folder's scripts it runs expanded in place: ``source X``, ``. X``,
  ``bash X``, ``sh X`` (X as ``$TEST_DIR/x.sh``, ``${TEST_DIR}/x.sh``, ``/tests/x.sh``, ``./x.sh`` or a bare
  name), ``$TEST_DIR/x.sh`` run directly and ``bash -c '...'``; recursively, each script once (a cycle ends)."""
  files = tests_folder_files(task)
  out: list[tuple[list[str], str]] = []
  seen: set[str] = set()

  def run(text: str, cwd: str) -> str:  # -> the working directory after it (what `source` keeps)
    for words in _commands(text):
      prog, args = posixpath.basename(words[0]) or words[0], words[1:]
      if prog in ("bash", "sh", "dash") and "-c" in args[:-1]:
        run(args[args.index("-c") + 1], cwd)
        continue
      ref = None
      if prog in ("source", ".", "bash", "sh", "dash"):
        ref = _tests_script(next((a for a in args if not a.startswith("-")), ""), files, bare=True)
      elif words[0] != prog:  # run by path
        ref = _tests_script(words[0], files, bare=False)
      if ref is not None:
        if ref not in seen:
          seen.add(ref)
          after = run(files[ref].read_text(errors="replace"), cwd)
          if prog in ("source", "."):
            cwd = after
        continue
      if prog == "cd":
        cwd = _cd(cwd, args)
      out.append((words, cwd))
    return cwd

  main = posixpath.relpath(task.test_script, "/tests")
  if main in files:
    seen.add(main)
    run(files[main].read_text(errors="replace"), image_workdir(task))
  return out


def script_words(task) -> list[list[str]]:
  """The words of each command of :func:`script_commands`."""
  return [w for w, _ in script_commands(task)]


def container_file(task, path: str) -> Path | None:
  """The host file that will be at container path ``path`` when the tests run: a file of the tests folder
  (``/tests/...``) or one the Dockerfile copies from the build context (the last COPY / ADD that holds it);
  None if neither has it."""
  path = posixpath.normpath(path)
  if path.startswith("/tests/"):
    return tests_folder_files(task).get(path[len("/tests/"):])
  ctx = Path(task.context_dir)
  root = ctx.resolve()
  for src, dst in reversed(dockerfile_layout(Path(task.dockerfile).read_text(errors="replace"))[1]):
    s = posixpath.normpath(src.lstrip("/"))
    if "://" in src or s.split("/")[0] in task.context_exclude or s.startswith(".."):
      continue
    host = ctx if s == "." else ctx / s
    if any(c in s for c in "*?["):
      if not dst.endswith("/") or posixpath.dirname(path) != dst.rstrip("/"):
        continue
      name = posixpath.basename(path)
      if not fnmatch.fnmatchcase(name, posixpath.basename(s)):
        continue
      f = host.parent / name
    elif host.is_dir():
      prefix = dst.rstrip("/") + "/"
      if not path.startswith(prefix):
        continue
      f = host / path[len(prefix):]
    else:
      target = dst + posixpath.basename(s) if dst.endswith("/") else dst
      if path != posixpath.normpath(target):
        continue
      f = host
    if f.is_file() and f.resolve().is_relative_to(root):
      return f
  return None
