"""Tamper protection and private files: what the verifier runs on, the agent's changes to it, what is put back.

:func:`protection` of the verifier's effective PATH says which paths the verifier's own execution depends on;
:func:`tampered_paths` and :func:`shadowing_programs` find the agent's changes to them in ``docker diff``
(tampering: the episode fails), :func:`agent_bytecode` the byte-code it left there (deleted before the tests
run), and :func:`restore_private` puts back the private files the image copied and the agent must not see
(:mod:`rsi_jax.env.verifier` runs these in order).
"""

from __future__ import annotations

import dataclasses
import functools
import posixpath
import re
from collections.abc import Mapping
from pathlib import Path

from rsi_jax.env.overlay import KIND_ADDED, KIND_DELETED, KIND_MODIFIED
from rsi_jax.env.sandbox import VERIFIER_ERROR, DockerSandbox, SandboxError
from rsi_jax.env.tasks import Task

# The verifier's PATH where the image sets none: system directories first.
VERIFIER_PATH = "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"
# pytest's configuration files: planted beside or above a test file the image copied, they are removed.
PYTEST_CONFIG = ("conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")

# What the verifier's own execution depends on; any change here (added, changed or deleted) is tampering:
# the interpreter and anything named like it or like pytest, the Python library and site-packages trees
# (sitecustomize and .pth files included; Debian keeps sitecustomize under /etc/python3.*), the dynamic
# loader and shared libraries, and the merged-/usr symlinks at the root.
_PROTECTED_ANY = re.compile(
    r"^/(usr/)?(local/)?s?bin/(python[0-9.]*(-config)?|pytest[-0-9.]*|py\.test[-0-9.]*)$"
    r"|^/usr/(local/)?lib/python3[^/]*(/.*)?$"
    r"|^/etc/python3[^/]*(/.*)?$"
    r"|^/etc/ld\.so\.(preload|conf)"
    r"|^/(usr/)?lib(64)?/(x86_64-linux-gnu/)?(ld-linux|lib[^/]*\.so)"
    r"|^/(bin|sbin|lib|lib64)$"
    r"|^/opt/rsi-verifier-[^/]+(/.*)?$"  # what the build fetched for the verifier (verifier_deps)
    r"|^/root/\.local/share/uv(/.*)?$")  # Python versions uv installed at build time for the verifier
# Beside the interpreters of the standard directories: what makes Python look for its library elsewhere (a
# venv's pyvenv.cfg beside the interpreter or one level up, a ._pth file beside it or its shared library).
_PROTECTED_STARTUP = re.compile(r"^/(usr/)?(local/)?pyvenv\.cfg$"
                                r"|^/(usr/)?(local/)?lib(64)?/(x86_64-linux-gnu/)?[^/]*\._pth$")
# Directories whose programs the verifier may run by name: the standard ones and root's ~/.local/bin (a verifier
# script that sources uv's env file puts it first on its PATH); an image's PATH adds its own.
STANDARD_DIRS = (*VERIFIER_PATH.split(":"), "/root/.local/bin")


@dataclasses.dataclass(frozen=True)
class Protection:
  """What the verifier runs on for one effective PATH. ``any_change``: paths where a change of any kind
  (added, changed, deleted) is tampering; ``programs``: programs in a directory on the PATH (or a standard one),
  which may not be changed or deleted (new ones may be added: tasks install tools); ``dirs``: the directories
  a new program is compared against for shadowing."""
  path: str
  dirs: tuple[str, ...]
  any_change: re.Pattern
  programs: re.Pattern


@functools.lru_cache(maxsize=256)
def protection(path: str = VERIFIER_PATH) -> Protection:
  """The :class:`Protection` for the verifier's PATH ``path``. Every directory on it (and each standard one)
  is a program directory where also the Python start-up files (``pyvenv.cfg``, ``pybuilddir.txt``, ``*._pth``)
  and anything inside a sub-folder (a build landmark such as ``Modules/Setup.local``, a ``lib/python3.X``
  tree) are protected; for a ``.../bin`` directory outside the standard ones, its prefix's ``pyvenv.cfg`` and
  ``lib/python3*`` tree (a venv's interpreter library and site-packages: pytest, ``.pth`` files,
  sitecustomize) and interpreters or pytest named like those of the system."""
  on_path = [posixpath.normpath(d) for d in path.split(":") if d.startswith("/")]
  extra = [d for d in dict.fromkeys(on_path) if d not in STANDARD_DIRS and d != "/"]
  dirs = tuple(dict.fromkeys([*on_path, *VERIFIER_PATH.split(":")]))
  alt = "|".join(re.escape(d) for d in (*STANDARD_DIRS, *extra))
  parts = [_PROTECTED_ANY.pattern, _PROTECTED_STARTUP.pattern,
           rf"^({alt})/(pyvenv\.cfg|pybuilddir\.txt|[^/]*\._pth|[^/]+/.+)$"]
  if extra:
    mine = "|".join(re.escape(d) for d in extra)
    parts.append(rf"^({mine})/(python[0-9.]*(-config)?|pytest[-0-9.]*|py\.test[-0-9.]*)$")
    prefixes = {posixpath.dirname(d) for d in extra if posixpath.basename(d) in ("bin", "sbin")}
    parents = {posixpath.dirname(d) for d in extra}
    if parents:
      parts.append(rf"^({'|'.join(re.escape(p.rstrip('/')) for p in parents)})/pyvenv\.cfg$")
    if prefixes:
      parts.append(rf"^({'|'.join(re.escape(p.rstrip('/')) for p in prefixes)})/lib(64)?/"
                   r"([^/]*\._pth|python3[^/]*(/.*)?)$")
  return Protection(path, dirs, re.compile("|".join(parts)), re.compile(rf"^({alt})/[^/]+$"))


def _entries(changed) -> list[tuple[str, int]]:
  return [(c, KIND_MODIFIED) if isinstance(c, str) else (c["Path"], c.get("Kind", KIND_MODIFIED))
          for c in changed]


def tampered_paths(changed, prot: Protection | None = None) -> list[str]:
  """The changes (``docker diff``: [{"Path": p, "Kind": 0 modified | 1 added | 2 deleted}] or bare paths,
  taken as modified) that touch what the verifier runs on (``prot``: :func:`protection` of its PATH, the
  standard one by default). Byte-code is ignored (Python writes it itself when an agent merely imports a
  module; the verifier never reads it, and deletes what the agent left in these trees: :func:`agent_bytecode`),
  and so is a "modified" entry for a directory that only holds other changes (``docker diff`` lists the
  parents of every change)."""
  prot = prot or protection()
  entries = _entries(changed)
  parents = {p.rsplit("/", 1)[0] or "/" for p, _ in entries}
  parents |= {q for p in list(parents) for q in _ancestors(p)}
  out = []
  for path, kind in entries:
    if "/__pycache__" in path or path.endswith((".pyc", ".pyo")):
      continue
    if kind == KIND_MODIFIED and path in parents:
      continue
    if prot.any_change.match(path) or (prot.programs.match(path) and kind != KIND_ADDED):
      out.append(path)
  return out


def agent_bytecode(changed, prot: Protection | None = None) -> list[str]:
  """Byte-code the agent added or changed inside what the verifier runs on (``docker diff`` entries under the
  protected trees of ``prot``: the interpreters' libraries, site-packages (a venv's on the image's PATH too),
  the verifier's fetched tools), optimized levels (``.opt-1.pyc``) and sourceless ``.pyc`` modules included.
  A test script that runs Python in isolated mode (``-I``) ignores the verifier's fresh pycache prefix and
  would load it in place of the source; the verifier deletes it first (Python falls back to the source, so
  nothing legitimate is lost)."""
  prot = prot or protection()
  out = []
  for path, kind in _entries(changed):
    if kind == KIND_DELETED or not prot.any_change.match(path):
      continue
    if path.endswith((".pyc", ".pyo")) or (kind == KIND_ADDED and path.endswith("/__pycache__")):
      out.append(path)
  return out


def _ancestors(path: str) -> list[str]:
  parts = path.strip("/").split("/")
  return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


# Bash builtins only (nothing on the agent's PATH runs): for each added program, is there another program of
# the same name in another directory of $VERIFIER_PATH (directories compared by their real path)?
_SHADOW_SCRIPT = r"""
for p in "$@"; do
  name=${p##*/}; here=$(cd -P "${p%/*}" 2>/dev/null && pwd -P)
  IFS=: read -ra dirs <<< "$VERIFIER_PATH"
  for d in "${dirs[@]}"; do
    real=$(cd -P "$d" 2>/dev/null && pwd -P) || continue
    if [[ "$real" != "$here" && -e "$d/$name" ]]; then echo "$p"; break; fi
  done
done
"""


def shadowing_programs(sandbox: DockerSandbox, changed, prot: Protection | None = None) -> list[str]:
  """New programs in a program directory of ``prot`` that shadow a program of the same name in another
  directory of the verifier's PATH or a standard one (e.g. ``/usr/local/bin/mkdir``, ``/usr/sbin/diff``, or
  ``/opt/venv/bin/mkdir`` with a venv first on the image's PATH)."""
  prot = prot or protection()
  added = [p for p, kind in _entries(changed) if kind == KIND_ADDED and prot.programs.match(p)]
  if not added:
    return []
  res = sandbox.exec_raw(["/bin/bash", "-c", _SHADOW_SCRIPT, "shadow", *added], timeout_s=30,
                         env={"VERIFIER_PATH": ":".join(prot.dirs)})
  return [x for x in res.output.splitlines() if x in added]


# Puts back private files: $1 = how many paths to restore, those paths, then paths to remove. Every folder above
# a restored path becomes a real folder (a link or a file there is removed), the path itself is cleared.
_RESTORE_SCRIPT = r"""
n=$1; shift
for p in "${@:1:n}"; do
  cur=
  IFS=/ read -ra parts <<< "${p%/*}"
  for c in "${parts[@]}"; do
    [[ -n $c ]] || continue
    cur=$cur/$c
    if [[ -L $cur || ( -e $cur && ! -d $cur ) ]]; then /bin/rm -rf -- "$cur" || exit 1; fi
    [[ -d $cur ]] || /bin/mkdir -- "$cur" || exit 1
  done
  /bin/rm -rf -- "$p" || exit 1
done
shift "$n"
if [[ $# -gt 0 ]]; then /bin/rm -rf -- "$@" || exit 1; fi
"""


def restore_plan(task: Task, changed) -> list[str]:
  """What the agent left that must go before the private files are put back (``docker diff`` entries, topmost
  only): anything it added inside a folder the image copied from the task (e.g. ``/app/tests/conftest.py``
  or byte-code of the tests), and pytest configuration (:data:`PYTEST_CONFIG`) it added or changed in a folder
  above a restored file (``/`` is cleared separately)."""
  origin = task.private_origin
  roots, above = set(), set()
  for dst, src in origin.items():
    try:
      depth = len(Path(src).relative_to(task.path).parts)
    except ValueError:
      depth = 1
    if depth > 1:
      roots.add(dst.rsplit("/", depth - 1)[0])
    above.update(_ancestors(dst))
  drop = []
  for path, kind in _entries(changed):
    if path in origin or kind == KIND_DELETED:
      continue
    parent, name = posixpath.split(path)
    if ((kind == KIND_ADDED and any(path.startswith(r + "/") for r in roots))
        or (parent in above and name in PYTEST_CONFIG)):
      drop.append(path)
  keep = set(drop)
  return sorted(p for p in drop if not any(a in keep for a in _ancestors(p)))


def restore_private(sandbox: DockerSandbox, task: Task, changed, modes: Mapping[str, int] | None = None):
  """Put every private file the image copied (``task.private_origin``) back at its path, from the task folder,
  with the mode the image gave it (``modes``, read before the agent started; the task file's own mode where
  none is known), after clearing what the agent left there (:func:`restore_plan`)."""
  origin = task.private_origin
  if not origin:
    return
  drop = restore_plan(task, changed)
  res = sandbox.exec_raw(["/bin/bash", "-c", _RESTORE_SCRIPT, "restore", str(len(origin)), *origin, *drop],
                         timeout_s=60)
  if res.exit_code != 0:
    raise SandboxError(VERIFIER_ERROR, f"{task.name}: could not clear the paths of its private files: "
                                       f"{' '.join(res.output.split())[-300:]}")
  by_mode: dict[int, dict[str, bytes]] = {}
  for dst, src in origin.items():
    try:
      mode = (modes or {}).get(dst)
      mode = Path(src).stat().st_mode & 0o777 if mode is None else mode
      by_mode.setdefault(mode, {})[dst] = Path(src).read_bytes()
    except OSError as e:
      raise SandboxError(VERIFIER_ERROR, f"{task.name}: cannot read {src} to put it back at {dst}: "
                                         f"{e.strerror}") from None
  for mode, files in sorted(by_mode.items()):
    sandbox.put_files(files, mode=mode)
