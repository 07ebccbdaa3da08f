"""What a task's verifier script installs at test time, resolved at image build time (offline verification).

Upstream verifier scripts fetch packages when the tests run (``pip install pytest==8.2.0``, ``uv pip install
-r requirements.txt``, ``uvx -w pytest-json-ctrf==0.3.5 pytest``, ``uv run --with ...``). Episode containers
have no network, so those commands would fail and the episode would silently score 0. When task builds have
a network (``env.build_network``), :func:`requirements` reads the script (and the requirement files it names
in the tests folder), the build downloads those packages — pinned versions kept — into
:data:`WHEELHOUSE` of the image (:func:`download_step`), and the verifier runs with :data:`OFFLINE_ENV`, so
the same unmodified commands install from there with the network off.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

WHEELHOUSE = "/opt/rsi-verifier-wheels"
OFFLINE_ENV = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": WHEELHOUSE, "UV_OFFLINE": "1", "UV_FIND_LINKS": WHEELHOUSE,
               "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
_OPTS_WITH_VALUE = {"-i", "--index-url", "--extra-index-url", "-c", "--constraint", "--target", "-t", "--prefix",
                    "--root", "-p", "--python", "--platform", "--python-version", "-e", "--editable",
                    "--find-links", "-f", "--cache-dir", "--src", "--from"}


def _script(task) -> str:
  name = Path(task.test_script).name
  for p in [Path(task.tests_dir) / name, *[Path(x) for x in task.extra_test_files]]:
    if p.name == name and p.is_file():
      return p.read_text(errors="replace")
  return ""


def _commands(text: str) -> list[list[str]]:
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


def _is_spec(w: str) -> bool:
  return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._\-]*(\[[\w,.\-]+\])?([<>=!~]=?[\w.*+!\-,<>=~]+)?", w))


def _positionals(args: list[str], handlers: dict):
  """The positional arguments of ``args``, in order; an option in ``handlers`` is passed its value, one in
  :data:`_OPTS_WITH_VALUE` skips its value, other options are skipped."""
  i = 0
  while i < len(args):
    a = args[i]
    if a in handlers and i + 1 < len(args):
      handlers[a](args[i + 1])
      i += 2
    elif a in _OPTS_WITH_VALUE:
      i += 2
    else:
      if not a.startswith("-"):
        yield a
      i += 1


def requirements(task) -> list[str]:
  """The package specifiers the verifier script installs (``pip``/``pip3``/``python -m pip``/``uv pip``
  ``install``, ``-r`` files in the tests folder, ``uvx``/``uv tool run``/``uv run`` ``--with``/``-w`` and
  the tool itself), sorted and unique."""
  specs: list[str] = []
  tests = Path(task.tests_dir)

  def from_file(name: str):
    f = tests / Path(name).name
    if f.is_file():
      specs.extend(w for ln in f.read_text(errors="replace").splitlines()
                   for w in [ln.split("#")[0].strip()] if w and _is_spec(w.replace(" ", "")))

  def with_specs(value: str):
    specs.extend(x for x in value.split(",") if _is_spec(x))

  for words in _commands(_script(task)):
    prog, rest = Path(words[0]).name, words[1:]
    if prog.startswith("python") and rest[:2] == ["-m", "pip"]:
      prog, rest = "pip", rest[2:]
    elif prog == "uv" and rest[:1] == ["pip"]:
      prog, rest = "pip", rest[1:]
    if prog in ("pip", "pip3") and rest[:1] == ["install"]:
      specs.extend(a for a in _positionals(rest[1:], {"-r": from_file, "--requirement": from_file}) if _is_spec(a))
      continue
    if prog == "uvx" or (prog == "uv" and rest[:2] == ["tool", "run"]):
      tool_args, names_tool = (rest if prog == "uvx" else rest[2:]), True
    elif prog == "uv" and rest[:1] == ["run"]:
      tool_args, names_tool = rest[1:], False  # `uv run CMD`: CMD is not a package
    else:
      continue
    handlers = {"-w": with_specs, "--with": with_specs, "--with-requirements": from_file}
    for a in _positionals(tool_args, handlers):  # options up to the tool; the tool's own arguments after it
      if names_tool and _is_spec(a):
        specs.append(a)  # the tool itself (uvx pytest)
      break
  return sorted(set(specs))


def download_step(specs: list[str]) -> str:
  """The Dockerfile step that puts ``specs`` (and their dependencies) into :data:`WHEELHOUSE`."""
  quoted = " ".join(shlex.quote(s) for s in specs)
  return (f"RUN mkdir -p {WHEELHOUSE} && python3 -m pip download --no-cache-dir --disable-pip-version-check "
          f"--dest {WHEELHOUSE} {quoted}")
