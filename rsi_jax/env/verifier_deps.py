"""What a task's verifier script installs at test time, resolved at image build time (offline verification).

Upstream verifier scripts fetch what they need when the tests run: ``apt-get install -y curl``, the ``uv``
installer (``curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh; source $HOME/.local/bin/env``), ``pip
install pytest==8.2.0``, ``uv pip install -r requirements.txt``, ``uv init; uv add pytest==8.4.1; uv run
pytest``, ``uvx -p 3.13 -w pytest-json-ctrf==0.3.5 pytest``. Episode containers have no network, so those
commands would fail and the episode would silently score 0. When task builds have a network
(``env.build_network``), :func:`build_steps` reads the unmodified script, the scripts of the tests folder it
sources or calls (``source $TEST_DIR/setup-uv-pytest.sh``, ``bash /tests/run.sh``; recursively) and the
requirement files they name (found where they will be when the tests run: in the tests folder, or copied
from the build context by the Dockerfile; :mod:`rsi_jax.env.verifier_script` reads the script and finds the
files), and appends to the task's Dockerfile:

- ``apt-get install`` of the packages the script installs (the package lists are kept, so the script's own
  ``apt-get install`` finds them installed with the network off);
- the packages pip and uv install, downloaded (pinned versions kept) into :data:`WHEELHOUSE`;
- the ``uv`` release the installer URL names, installed under :data:`TOOLS` (not on the agent's PATH); the
  verifier puts it where the installer would (``$HOME/.local/bin`` with its ``env`` file,
  :func:`uv_preseed_script`) just before the script runs, so the installer step is satisfied locally;
- the script's own ``uv``/``uvx`` commands, replayed at build time in a copy of the image's working
  directory (the tools' arguments replaced by ``--version``) so that uv's cache (:data:`UV_CACHE`) holds
  everything they resolve; a command that fails there fails the build naming it (offline, at test time, it
  could only fail too); the Python versions they request (``-p 3.13``) are found in the image or installed by
  uv (a build step that fails naming the version where it cannot be downloaded).

The verifier runs with :data:`OFFLINE_ENV`: pip and uv install from the image with the network off.
:data:`WHEELHOUSE`, :data:`TOOLS` and uv's Python installs are protected from the agent (a change there is
tampering, ``rsi_jax.env.verifier``).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from pathlib import Path

from rsi_jax.env.verifier_script import (container_file, container_path, image_workdir, script_commands,
                                         script_words, tests_folder_files)

WHEELHOUSE = "/opt/rsi-verifier-wheels"
TOOLS = "/opt/rsi-verifier-tools"
UV_CACHE = f"{TOOLS}/uv-cache"
UV_HOME = f"{TOOLS}/uv"  # pip --target of the uv wheel: uv and uvx in bin/
OFFLINE_ENV = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": WHEELHOUSE, "UV_OFFLINE": "1", "UV_FIND_LINKS": WHEELHOUSE,
               "UV_CACHE_DIR": UV_CACHE, "UV_PYTHON_DOWNLOADS": "never", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
               # pip's and uv's configuration files are the agent's to write: the verifier's installs read none
               # (pip lets these variables override a file's find-links already; the rest of a file could still
               # change what gets installed: constraints, pre-releases, targets)
               "PIP_CONFIG_FILE": "/dev/null", "UV_NO_CONFIG": "1"}
_OPTS_WITH_VALUE = {"-i", "--index-url", "--extra-index-url", "-c", "--constraint", "--target", "-t", "--prefix",
                    "--root", "-p", "--python", "--platform", "--python-version", "-e", "--editable",
                    "--find-links", "-f", "--cache-dir", "--src", "--from", "--group", "--optional",
                    "--directory", "--project", "--package", "--extra", "-o", "--option"}
_UV_INSTALLER = re.compile(r"astral\.sh/uv/(?:([0-9][0-9A-Za-z.+-]*)/)?install\.sh")
# uv subcommands whose replay at build time fills the cache (others: nothing to fetch, or not ours to run)
_UV_REPLAY = {"init", "add", "sync", "lock", "venv", "pip", "run", "tool"}


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


def _split_opts(args: list[str]) -> list[str]:
  """``--opt=value`` and ``-rFILE`` as two words each."""
  out = []
  for a in args:
    if a.startswith("--") and "=" in a:
      out += a.split("=", 1)
    elif re.fullmatch(r"-r[^-\s]\S*", a):
      out += ["-r", a[2:]]
    else:
      out.append(a)
  return out


def requirements(task) -> list[str]:
  """The package specifiers the verifier script installs (``pip``/``pip3``/``python -m pip``/``uv pip``
  ``install``, ``uv add``, ``-r`` files (and the files they name) where they will be at test time: the tests
  folder, or the app folder the Dockerfile copies from the build context, relative to the script's working
  directory; ``uvx``/``uv tool run``/``uv run`` ``--with``/``-w`` and the tool itself), sorted and unique."""
  specs: list[str] = []
  read: set[Path] = set()

  def from_file(name: str, cwd: str):
    path = container_path(name, cwd)
    f = container_file(task, path) if path else None
    if f is None:  # not found where the script looks: the tests folder's file of that name, if any
      f = tests_folder_files(task).get(posixpath.basename(name))
      path = "/tests/" + posixpath.basename(name)
    if f is None or f in read:
      return
    read.add(f)
    for ln in f.read_text(errors="replace").splitlines():
      w = ln.split(" #")[0].strip() if not ln.lstrip().startswith("#") else ""
      nested = _split_opts(w.split())
      if nested[:1] in (["-r"], ["--requirement"]) and len(nested) > 1:
        from_file(nested[1], posixpath.dirname(path))
      elif w and _is_spec(w.replace(" ", "")):
        specs.append(w)

  def with_specs(value: str):
    specs.extend(x for x in value.split(",") if _is_spec(x))

  for words, cwd in script_commands(task):
    prog, rest = Path(words[0]).name, _split_opts(words[1:])
    if prog.startswith("python") and rest[:2] == ["-m", "pip"]:
      prog, rest = "pip", rest[2:]
    elif prog == "uv" and rest[:1] == ["pip"]:
      prog, rest = "pip", rest[1:]
    req = {"-r": lambda v, cwd=cwd: from_file(v, cwd), "--requirement": lambda v, cwd=cwd: from_file(v, cwd)}
    if (prog in ("pip", "pip3") and rest[:1] == ["install"]) or (prog == "uv" and rest[:1] == ["add"]):
      specs.extend(a for a in _positionals(rest[1:], req) if _is_spec(a))
      continue
    if prog == "uvx" or (prog == "uv" and rest[:2] == ["tool", "run"]):
      tool_args, names_tool = (rest if prog == "uvx" else rest[2:]), True
    elif prog == "uv" and rest[:1] == ["run"]:
      tool_args, names_tool = rest[1:], False  # `uv run CMD`: CMD is not a package
    else:
      continue
    handlers = {"-w": with_specs, "--with": with_specs, "--with-requirements": req["-r"]}
    for a in _positionals(tool_args, handlers):  # options up to the tool; the tool's own arguments after it
      if names_tool and _is_spec(a):
        specs.append(a)  # the tool itself (uvx pytest)
      break
  return sorted(set(specs))


def uv_installer(task) -> str | None:
  """The uv version the script's installer URL names (``""``: the newest), or None without one."""
  for words in script_words(task):  # comments left out
    for w in words:
      m = _UV_INSTALLER.search(w)
      if m:
        return m.group(1) or ""
  return None


def apt_packages(task) -> list[str]:
  """The packages the script installs with ``apt-get install`` / ``apt install``, sorted and unique."""
  out = []
  for words in script_words(task):
    prog, rest = Path(words[0]).name, words[1:]
    if prog in ("apt-get", "apt") and "install" in rest:
      out += [w for w in rest[rest.index("install") + 1:]
              if not w.startswith("-") and re.fullmatch(r"[a-z0-9][a-z0-9+.\-]*(:[a-z0-9]+)?(=[\w.:~+\-]+)?", w)]
  return sorted(set(out))


def _uv_replays(task) -> list[tuple[list[str], str | None]]:
  """The script's ``uv``/``uvx`` commands, each made safe to run at build time (a tool's or a ``run``
  command's own arguments replaced by ``--version``: ``uvx -w x pytest /tests`` -> ``uvx -w x pytest
  --version``; ``uv run pytest`` -> ``uv run python --version``), with the folder it runs in (None: the image's
  working directory)."""
  out = []
  skip = {k: (lambda v: None) for k in ("-w", "--with", "--with-requirements", "--with-editable")}
  start = image_workdir(task)
  for words, cwd in script_commands(task):
    prog, rest = Path(words[0]).name, words[1:]
    where = None if cwd == start else cwd
    if prog == "uvx" or (prog == "uv" and rest[:2] == ["tool", "run"]):
      head = ["uvx"] if prog == "uvx" else ["uv", "tool", "run"]
      args = rest if prog == "uvx" else rest[2:]
      tool = next((a for a in _positionals(args, skip) if _is_spec(a)), None)
      if tool is not None:
        out.append((head + args[:args.index(tool) + 1] + ["--version"], where))
    elif prog == "uv" and rest[:1] == ["run"]:
      cmd = next(iter(_positionals(rest[1:], skip)), None)
      opts = rest[1:rest.index(cmd, 1)] if cmd is not None else rest[1:]
      out.append((["uv", "run", *opts, "python", "--version"], where))
    elif prog == "uv" and rest[:1] and rest[0] in _UV_REPLAY:
      out.append((["uv", *rest], where))
  return out


def _uv_commands(task) -> list[list[str]]:
  """The commands of :func:`_uv_replays`."""
  return [c for c, _ in _uv_replays(task)]


def python_requests(task) -> list[str]:
  """The Python versions the script's uv commands ask for (``-p 3.13``, ``--python 3.12``)."""
  out = []
  for cmd in _uv_commands(task):
    for i, w in enumerate(cmd[:-1]):
      if w in ("-p", "--python") and re.fullmatch(r"(cpython-|python)?3(\.\d+)*", cmd[i + 1]):
        out.append(cmd[i + 1])
  return sorted(set(out))


def fetches(task) -> list[str]:
  """What the verifier script fetches at test time, in words (``apt curl``, ``uv 0.7.13``, ``pytest==8.4.1``,
  ``python 3.13``); [] when nothing."""
  out = [f"apt {p}" for p in apt_packages(task)]
  v = uv_installer(task)
  if v is not None:
    out.append(f"uv {v or '(newest)'}")
  out += requirements(task) + [f"python {v}" for v in python_requests(task)]
  return out


def _last_user(dockerfile: str) -> str | None:
  users = [ln.split(None, 1)[1].strip() for ln in dockerfile.splitlines()
           if re.match(r"\s*USER\s+\S", ln, re.IGNORECASE)]
  return users[-1] if users else None


def build_steps(task, dockerfile: str) -> str:
  """The Dockerfile steps (appended to the task's own) that put what the verifier script fetches at test
  time into the image; "" when it fetches nothing. Run as root; the task's last ``USER`` is restored."""
  steps = []
  apt = apt_packages(task)
  if apt:
    steps.append("RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
                 + " ".join(shlex.quote(x) for x in apt))
  specs = requirements(task)
  if specs:
    steps.append(download_step(specs))
  version = uv_installer(task)
  uv = "uv"
  if version is not None:
    spec = f"uv=={version}" if version else "uv"
    steps.append(f"RUN PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore python3 -m pip install --no-cache-dir "
                 f"--disable-pip-version-check --target {UV_HOME} {shlex.quote(spec)}")
    uv = f"{UV_HOME}/bin/uv"
  cmds = _uv_replays(task)
  if cmds:
    env = f"PATH={UV_HOME}/bin:$PATH UV_CACHE_DIR={UV_CACHE} UV_FIND_LINKS={WHEELHOUSE}"
    for v in python_requests(task):  # a build failure naming the version where uv cannot download it
      steps.append(f"RUN {env} {uv} python find {shlex.quote(v)} >/dev/null 2>&1 || {env} {uv} python install "
                   f"{shlex.quote(v)}")
    # (the wheelhouse exists even when empty: uv refuses a --find-links folder that does not)
    steps.append(f'RUN mkdir -p {WHEELHOUSE} && w=$(pwd) && d=$(mktemp -d) && export {env} && {_replay(cmds)} && '
                 f'cd / && rm -rf "$d"')
  if not steps:
    return ""
  user = _last_user(dockerfile)
  if user and user not in ("root", "0", "0:0"):
    steps = ["USER root", *steps, f"USER {user}"]
  return "# rsi_jax: what the verifier script fetches at test time (rsi_jax.env.verifier_deps)\n" + \
      "\n".join(steps) + "\n"


def _replay(cmds: list[tuple[list[str], str | None]]) -> str:
  """Shell that replays uv commands, each in a copy (under ``$d``) of the folder it runs in at test time (None:
  ``$w``, the image's working directory; a folder the image lacks: an empty one). A command that fails ends
  the build with a line naming it; ``uv init`` is left out where the folder already holds a project (it
  would fail on it at test time too)."""
  out, dirs = [], {}
  for cmd, cwd in cmds:
    if cwd not in dirs:
      i = dirs[cwd] = len(dirs)
      src = '"$w"' if cwd is None else shlex.quote(cwd)
      out.append(f'mkdir "$d/{i}" && {{ [ {src} = / ] || [ ! -d {src} ] || cp -a {src}/. "$d/{i}/"; }}')
    line = shlex.join(cmd)
    why = shlex.quote(f"rsi_jax: error: the verifier script command `{line}` failed at build time (replayed "
                      f"to fill the uv cache; offline, at test time, it would fail too)")
    run = f"{{ {line} || {{ echo {why} >&2; exit 1; }}; }}"
    if cmd[:2] == ["uv", "init"]:
      run = f"{{ [ -e pyproject.toml ] || {run}; }}"
    out.append(f'cd "$d/{dirs[cwd]}" && {run}')
  return " && ".join(out)


# What the uv installer writes next to uv: sourcing it puts $HOME/.local/bin on PATH.
UV_ENV_FILE = """#!/bin/sh
# add binaries to PATH if they aren't added yet
case ":${PATH}:" in
    *:"$HOME/.local/bin":*)
        ;;
    *)
        export PATH="$HOME/.local/bin:$PATH"
        ;;
esac
"""


def uv_preseed_script() -> str:
  """Shell (run by the verifier before the test script) that leaves what the uv installer leaves: ``uv`` and
  ``uvx`` in ``$HOME/.local/bin`` and the ``env`` file that puts them on PATH."""
  return (f'[ -x {UV_HOME}/bin/uv ] || exit 0\n'
          'mkdir -p "$HOME/.local/bin"\n'
          'rm -rf "$HOME/.local/bin/uv" "$HOME/.local/bin/uvx" "$HOME/.local/bin/env"\n'
          f'cp {UV_HOME}/bin/uv {UV_HOME}/bin/uvx "$HOME/.local/bin/"\n'
          f"cat > \"$HOME/.local/bin/env\" <<'RSI_EOF'\n{UV_ENV_FILE}RSI_EOF\n")


def download_step(specs: list[str]) -> str:
  """The Dockerfile step that puts ``specs`` (and their dependencies) into :data:`WHEELHOUSE`."""
  quoted = " ".join(shlex.quote(s) for s in specs)
  return (f"RUN mkdir -p {WHEELHOUSE} && python3 -m pip download --no-cache-dir --disable-pip-version-check "
          f"--dest {WHEELHOUSE} {quoted}")
