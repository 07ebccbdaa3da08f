"""Every key of configs/base.yml is read by the program as a key of its own section: no dead settings.

The source of ``rsi_jax/`` (the config modules aside) is read as a syntax tree. A read of ``key`` counts for
section ``S`` only where the object it is read from is that section: ``cfg.S.key``, ``self.cfg.S.key``,
``x.key`` after ``x = cfg.S`` (or ``self.x = cfg.S`` in the same class), a parameter annotated with the
section's class (``rcfg: RewardConfig``), or a generic class shared by several sections (``OptimConfig``) for
each of those sections whose object the program passes on (``make_optimizer(cfg.critic_optim)``). A key whose
name another section reads does not count.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import typing

import yaml

from rsi_jax.config import CONFIG_DIR, REPO_ROOT, Config

SECTIONS = {f.name: typing.get_type_hints(Config)[f.name] for f in dataclasses.fields(Config)}
CLASS_SECTIONS: dict[str, set[str]] = {}
for _name, _cls in SECTIONS.items():
  CLASS_SECTIONS.setdefault(_cls.__name__, set()).add(_name)
CONFIG_NAME = re.compile(r"(^|_)(cfg|config)$|^c$")  # cfg, pcfg, self.cfg, spec.cfg, config, c = self.cfg
CONFIG_MODULES = ("config.py", "config_checks.py", "config_learning.py", "config_schema.py",
                  "config_loader.py")  # the schema reads its own keys


def _sources() -> dict[str, ast.AST]:
  root = REPO_ROOT / "rsi_jax"
  return {str(p.relative_to(REPO_ROOT)): ast.parse(p.read_text(), str(p)) for p in sorted(root.rglob("*.py"))
          if p.relative_to(root).as_posix() not in CONFIG_MODULES}


def _annotation_names(ann) -> set[str]:
  if ann is None:
    return set()
  if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
    ann = ast.parse(ann.value, mode="eval").body
  return {n.id for n in ast.walk(ann) if isinstance(n, ast.Name)} | {
      n.attr for n in ast.walk(ann) if isinstance(n, ast.Attribute)}


class _Reads(ast.NodeVisitor):
  """Section key reads in one module: {(section, key)}; ``passed``: sections whose object is a call argument;
  ``calls``: {(function name, parameter position or name): sections} of the arguments passed."""

  def __init__(self, params: dict | None = None, literals: dict | None = None):
    self.params = params or {}  # (function name, position or name) -> sections passed there (every module)
    self.literals = literals or {}  # name -> the strings of a module-level tuple / list / set / dict literal
    self.calls: dict[tuple, set[str]] = {}
    self.loops: dict[str, set[str]] = {}  # loop variable -> literal names it runs over
    self.reads: set[tuple[str, str]] = set()
    self.generic: dict[str, set[str]] = {}  # class name -> keys read through a parameter of that class
    self.passed: set[str] = set()
    self.scopes: list[dict[str, set[str]]] = [{}]  # name -> sections (or {"<config>"})
    self.self_attrs: list[dict[str, set[str]]] = [{}]

  def run(self, tree: ast.AST):
    for node in ast.walk(tree):  # loop variables first: a read may come before its loop in the source
      if isinstance(node, (ast.comprehension, ast.For)):
        self.visit_comprehension(node, descend=False)
    self.visit(tree)

  # -- what an expression is

  def _config_ish(self, e) -> bool:
    if isinstance(e, ast.Name):
      return bool(CONFIG_NAME.search(e.id)) or "<config>" in self._lookup(e.id)
    if isinstance(e, ast.Attribute):
      if isinstance(e.value, ast.Name) and e.value.id == "self" and "<config>" in self.self_attrs[-1].get(e.attr, ()):
        return True
      return bool(CONFIG_NAME.search(e.attr))
    return False

  def _lookup(self, name: str) -> set[str]:
    for scope in reversed(self.scopes):
      if name in scope:
        return scope[name]
    return set()

  def sections_of(self, e) -> set[str]:
    if isinstance(e, ast.BoolOp):  # config or RewardConfig()
      return set().union(*(self.sections_of(v) for v in e.values))
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and len(CLASS_SECTIONS.get(e.func.id, ())) == 1:
      return set(CLASS_SECTIONS[e.func.id])
    if isinstance(e, ast.Attribute) and e.attr in SECTIONS and self._config_ish(e.value):
      return {e.attr}
    if isinstance(e, ast.Name):
      return {s for s in self._lookup(e.id) if s in SECTIONS or s.startswith("<class ")}
    if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
      return {s for s in self.self_attrs[-1].get(e.attr, ()) if s in SECTIONS or s.startswith("<class ")}
    return set()

  def _bind(self, target, value):
    secs = self.sections_of(value)
    if not secs and self._config_ish(value):
      secs = {"<config>"}
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
      for t, v in zip(target.elts, value.elts):
        self._bind(t, v)
      return
    if not secs:
      return
    if isinstance(target, ast.Name):
      self.scopes[-1][target.id] = secs
    elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
      self.self_attrs[-1][target.attr] = secs

  # -- visitors

  def visit_ClassDef(self, node):
    self.self_attrs.append({})
    for item in node.body:  # self.x = cfg.S anywhere in the class, before its methods are read
      for sub in ast.walk(item):
        if isinstance(sub, ast.Assign):
          for t in sub.targets:
            self._bind(t, sub.value)
    self.generic_visit(node)
    self.self_attrs.pop()

  def visit_FunctionDef(self, node):
    scope = {}
    positional = node.args.posonlyargs + node.args.args
    shift = 1 if positional and positional[0].arg in ("self", "cls") else 0
    for i, a in enumerate(positional + node.args.kwonlyargs):
      passed = self.params.get((node.name, a.arg), set())
      if i - shift >= 0 and a in positional:
        passed = passed | self.params.get((node.name, i - shift), set())
      if passed:
        scope[a.arg] = set(passed)
      for name in _annotation_names(a.annotation):  # cfg: Config, r: RewardConfig | None, o: "OptimConfig"
        if name == "Config":
          scope[a.arg] = {"<config>"}
        elif name in CLASS_SECTIONS:
          secs = CLASS_SECTIONS[name]
          scope[a.arg] = set(secs) if len(secs) == 1 else {f"<class {name}>"}
    self.scopes.append(scope)
    for sub in ast.walk(node):  # x = cfg.S anywhere in the function
      if isinstance(sub, ast.Assign):
        for t in sub.targets:
          self._bind(t, sub.value)
      elif isinstance(sub, (ast.AnnAssign, ast.NamedExpr)) and sub.value is not None:
        self._bind(sub.target, sub.value)
    self.generic_visit(node)
    self.scopes.pop()

  visit_AsyncFunctionDef = visit_FunctionDef

  def visit_Attribute(self, node):
    for s in self.sections_of(node.value):
      if s.startswith("<class "):
        self.generic.setdefault(s[len("<class "):-1], set()).add(node.attr)
      else:
        self.reads.add((s, node.attr))
    self.generic_visit(node)

  def visit_Call(self, node):
    name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
    for where, a in [*enumerate(node.args), *((k.arg, k.value) for k in node.keywords)]:
      secs = {s for s in self.sections_of(a) if s in SECTIONS}
      self.passed |= secs
      if secs and name:
        self.calls.setdefault((name, where), set()).update(secs)
    if name == "getattr" and isinstance(node.func, ast.Name) and len(node.args) >= 2:
      key = node.args[1]
      keys = {key.value} if isinstance(key, ast.Constant) and isinstance(key.value, str) else set()
      if isinstance(key, ast.Name):  # getattr(cfg.mesh, k) for k in _ICI_KEYS
        keys = {x for lit in self.loops.get(key.id, ()) for x in self.literals.get(lit, ())}
      for s in self.sections_of(node.args[0]):
        if s in SECTIONS:
          self.reads |= {(s, k) for k in keys}
    self.generic_visit(node)

  def visit_comprehension(self, node, descend: bool = True):
    if isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Name):
      self.loops.setdefault(node.target.id, set()).add(node.iter.id)
    if descend:
      self.generic_visit(node)

  def visit_For(self, node):
    self.visit_comprehension(node)


def _literals(tree: ast.AST) -> dict[str, set[str]]:
  out = {}
  for node in tree.body:
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
      v = node.value
      items = v.keys if isinstance(v, ast.Dict) else v.elts if isinstance(v, (ast.Tuple, ast.List, ast.Set)) else []
      strings = {x.value for x in items if isinstance(x, ast.Constant) and isinstance(x.value, str)}
      for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
        if strings and isinstance(t, ast.Name):
          out[t.id] = strings
  return out


def section_reads(sources: dict[str, ast.AST]) -> set[tuple[str, str]]:
  """{(section, key)} the program reads."""
  params: dict[tuple, set[str]] = {}
  for _ in range(3):  # sections handed on through parameters, a few calls deep
    found = {}
    for tree in sources.values():
      v = _Reads(params, _literals(tree))
      v.run(tree)
      for k, secs in v.calls.items():
        found.setdefault(k, set()).update(secs)
    if found == params:
      break
    params = found
  reads, generic, passed = set(), {}, set()
  for tree in sources.values():
    v = _Reads(params, _literals(tree))
    v.run(tree)
    reads |= v.reads
    passed |= v.passed
    for cls, keys in v.generic.items():
      generic.setdefault(cls, set()).update(keys)
  for cls, keys in generic.items():  # read through a shared class: for each section passed on to such code
    reads |= {(s, k) for s in CLASS_SECTIONS[cls] & passed for k in keys}
  return reads


def test_every_base_key_is_read_as_a_key_of_its_section():
  base = yaml.safe_load((CONFIG_DIR / "base.yml").read_text())
  reads = section_reads(_sources())
  unread = [f"{section}.{key}" for section, keys in base.items() if isinstance(keys, dict)
            for key in keys if (section, key) not in reads]
  assert unread == []


def test_reads_are_told_apart_by_section():
  """The analysis itself: a key another section reads, or a read from an object that is not a section, does
  not count; reads through a name bound to a section, a self attribute, an annotated parameter and a generic
  class passed on do."""
  src = '''
class Trainer:
  def __init__(self, cfg):
    self.cfg = cfg
    self.ecfg = cfg.eval

  def step(self, rcfg: RewardConfig, other):
    x = self.cfg.rl.clip_low + self.ecfg.repeats + rcfg.kind + other.eval.tasks_dir
    ocfg = self.cfg.sampler
    return x, ocfg.num_slots, make_optimizer(self.cfg.critic_optim)


def make_optimizer(o: OptimConfig):
  return o.learning_rate
'''
  got = section_reads({"m.py": ast.parse(src)})
  assert got == {("rl", "clip_low"), ("eval", "repeats"), ("reward", "kind"), ("sampler", "num_slots"),
                 ("critic_optim", "learning_rate")}
