"""The import graph of ``rsi_jax/``, read from the source: no cycle, and no module imports one of a higher layer.

Every import counts, top-level or inside a function (a lazy import is still a dependency, and a cycle through
it still breaks whoever imports the other end first). Importing ``a.b.c`` also runs the packages ``a.b``'s
``__init__`` (when the importer is not inside it), so that is an edge too. Layers, lowest first; a module may
import its own layer or a lower one.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(os.environ.get("RSI_LAYERS_ROOT", Path(__file__).resolve().parents[1]))
PACKAGE = "rsi_jax"

LAYERS = (
    ("base", ("rsi_jax", "rsi_jax.config", "rsi_jax.config_checks", "rsi_jax.config_learning",
              "rsi_jax.config_schema", "rsi_jax.config_loader", "rsi_jax.log", "rsi_jax.stop", "rsi_jax.policy",
              "rsi_jax.distributed", "rsi_jax.units", "rsi_jax.cli", "rsi_jax.jsonl")),  # import only each other
    ("rl", ("rsi_jax.rl",)),  # RL math, rewards, CTRF, outcome tables: numpy / JAX only
    ("models", ("rsi_jax.models",)),  # MaxText actor / critic, HF import, checkpoints, optimizer step
    ("sampler", ("rsi_jax.sampler",)),  # decode engines and the serving loop over an actor's params
    ("env", ("rsi_jax.env",)),  # tasks, sandboxes, harnesses, verifier, pool, rollout collection
    ("rsr", ("rsi_jax.rsr",)),  # Recursive Self-Rewrite's funnel over env episodes
    ("eval", ("rsi_jax.eval",)),  # evaluation runs and reports
    ("pipeline", ("rsi_jax.pipeline",)),  # the phase plan, the RPR step, the run driver
    ("entry", ("rsi_jax.train", "rsi_jax.rsr.__main__", "rsi_jax.eval.__main__",
               "rsi_jax.view")),  # command lines; the run browser reads what they write
)


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
  """Dotted module name -> (file, is a package ``__init__``) for every ``.py`` under ``root/rsi_jax``."""
  out = {}
  for p in sorted((root / PACKAGE).rglob("*.py")):
    parts = list(p.relative_to(root).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    out[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
  return out


def _targets(name: str, is_pkg: bool, tree: ast.AST, mods) -> set[str]:
  """The rsi_jax modules one module's source imports (resolved to modules of ``mods``)."""
  pkg = name if is_pkg else name.rpartition(".")[0]
  found: set[str] = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
      else:
        mod = node.module or ""
      for a in node.names:  # `from p import m` imports the module p.m when there is one, else names of p
        found.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod)
    elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module" \
        and node.args:
      arg = node.args[0]
      if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        found.add(arg.value)
      elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = str(arg.values[0].value)  # a computed name: any module it could name
        found.update(m for m in mods if m.startswith(prefix))
  out = set()
  for t in found:
    if t != PACKAGE and not t.startswith(PACKAGE + "."):
      continue
    while t not in mods and "." in t:  # `import a.b.Name`-style leftovers: the enclosing module
      t = t.rpartition(".")[0]
    out.add(t)
    parts = t.split(".")
    for i in range(2, len(parts)):  # the packages on the way run their __init__ first (unless already running)
      up = ".".join(parts[:i])
      if up in mods and not name.startswith(up + "."):
        out.add(up)
  out.discard(name)
  return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
  mods = modules(root)
  return {name: _targets(name, is_pkg, ast.parse(p.read_text(), str(p)), mods)
          for name, (p, is_pkg) in mods.items()}


def layer_of(module: str) -> int | None:
  """Index in LAYERS of the longest layer entry naming ``module`` or a package above it."""
  best = None
  for i, (_, names) in enumerate(LAYERS):
    for n in names:
      if module == n or (n != PACKAGE and module.startswith(n + ".")):
        if best is None or len(n) > best[0]:
          best = (len(n), i)
  return None if best is None else best[1]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """One cycle (a list of modules, first repeated last) for each strongly connected group of modules."""
  index, low, stack, on, groups = {}, {}, [], set(), []

  def visit(v):  # Tarjan
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      group = set()
      while True:
        w = stack.pop()
        on.discard(w)
        group.add(w)
        if w == v:
          break
      if len(group) > 1:
        groups.append(group)

  for v in sorted(graph):
    if v not in index:
      visit(v)
  out = []
  for group in groups:  # a path inside the group from its first module back to itself
    start = min(group)
    prev, queue = {start: None}, [start]
    end = None
    while queue and end is None:
      v = queue.pop(0)
      for w in sorted(graph[v] & group):
        if w == start:
          end = v
          break
        if w not in prev:
          prev[w] = v
          queue.append(w)
    path = []
    while end is not None:
      path.append(end)
      end = prev[end]
    out.append(path[::-1] + [start])
  return out


@pytest.fixture(scope="module")
def graph():
  return import_graph()


def test_every_module_has_a_layer(graph):
  missing = sorted(m for m in graph if layer_of(m) is None)
  assert not missing, f"modules without a layer (add them to LAYERS in tests/test_layers.py): {missing}"


def test_no_import_cycle(graph):
  found = cycles(graph)
  assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_no_upward_import(graph):
  up = sorted((m, t) for m, ts in graph.items() for t in ts
              if layer_of(m) is not None and layer_of(t) is not None and layer_of(t) > layer_of(m))
  assert not up, "imports of a higher layer: " + "; ".join(
      f"{m} ({LAYERS[layer_of(m)][0]}) -> {t} ({LAYERS[layer_of(t)][0]})" for m, t in up)


def test_the_graph_reads_lazy_and_relative_imports(tmp_path):
  """The reader itself: a lazy import, a relative one, ``from pkg import module``, and the package on the way."""
  pkg = tmp_path / PACKAGE
  (pkg / "a").mkdir(parents=True)
  (pkg / "b").mkdir()
  for f, text in {"__init__.py": "", "a/__init__.py": "", "b/__init__.py": "from . import y\n",
                  "a/x.py": "def f():\n  from rsi_jax.b import y\n", "b/y.py": "from ..a import x\n",
                  "b/z.py": "from rsi_jax import b\nfrom .y import thing\n"}.items():
    (pkg / f).write_text(text)
  g = import_graph(tmp_path)
  assert g["rsi_jax.a.x"] == {"rsi_jax.b", "rsi_jax.b.y"}
  assert g["rsi_jax.b.y"] == {"rsi_jax.a", "rsi_jax.a.x"}
  assert g["rsi_jax.b"] == {"rsi_jax.b.y"}
  assert g["rsi_jax.b.z"] == {"rsi_jax.b", "rsi_jax.b.y"}  # its own package named: an edge; on the way: none
  assert cycles(g) == [["rsi_jax.a.x", "rsi_jax.b.y", "rsi_jax.a.x"]]


MAX_MODULE_LINES = 450  # issue 32: one job per module; a module that grows past this is split along its seam


def test_no_module_is_longer_than_the_limit():
  """Every module of ``rsi_jax/`` has at most MAX_MODULE_LINES lines, and says its one job in its docstring's
  first line."""
  long = {m: n for m, (p, _) in modules(ROOT).items() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
  assert not long, f"modules over {MAX_MODULE_LINES} lines (split them along their seams): {long}"
  silent = sorted(m for m, (p, is_pkg) in modules(ROOT).items()
                  if p.read_text().strip() and not (ast.get_docstring(ast.parse(p.read_text())) or "").strip())
  assert not silent, f"modules without a docstring saying their job: {silent}"
