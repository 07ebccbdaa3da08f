"""Packaging: every import of the package is declared in pyproject.toml (core or an extra), the core modules
import only core dependencies, and the core wheel installs alone into a fresh virtualenv and runs a scan
estimator and a loss (what someone unit-testing rsi_jax.rl without MaxText or Docker does)."""

import ast
import importlib.metadata as md
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# modules whose module-level imports must be core dependencies
CORE = ("rsi_jax/__init__.py", "rsi_jax/config.py", "rsi_jax/config_checks.py", "rsi_jax/config_learning.py",
        "rsi_jax/config_schema.py", "rsi_jax/config_loader.py", "rsi_jax/policy.py", "rsi_jax/rl/")


def _norm(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def _declared():
  proj = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  name = lambda req: _norm(re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0])
  core = {name(r) for r in proj["dependencies"]}
  extras = {k: {name(r) for r in v} for k, v in proj["optional-dependencies"].items()}
  return core, extras


def _imports(path: Path):
  """(top-level module, at module level?) for every absolute import in the file."""
  tree = ast.parse(path.read_text())
  top_level = {id(n) for n in tree.body}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      names = [node.module]
    else:
      continue
    for n in names:
      yield n.split(".")[0], id(node) in top_level


def test_every_import_is_declared_and_the_core_needs_only_core_dependencies():
  core, extras = _declared()
  everything = core.union(*extras.values())
  dists = md.packages_distributions()
  undeclared, not_core = [], []
  for f in sorted((REPO / "rsi_jax").rglob("*.py")):
    rel = f.relative_to(REPO).as_posix()
    for mod, module_level in _imports(f):
      if mod in sys.stdlib_module_names or mod == "rsi_jax":
        continue
      names = {_norm(d) for d in dists.get(mod, [mod])}
      if not names & everything:
        undeclared.append(f"{rel}: {mod} ({sorted(names)})")
      if module_level and rel.startswith(CORE) and not names & core:
        not_core.append(f"{rel}: {mod}")
  assert not undeclared, f"imports not declared in pyproject.toml: {undeclared}"
  assert not not_core, f"core modules import non-core dependencies at module level: {not_core}"
  assert {"models", "env", "train", "tpu", "dev"} <= set(extras)
  assert "maxtext" in extras["models"] and "docker" in extras["env"] and not {"maxtext", "docker"} & core


def test_the_lock_satisfies_the_declared_ranges():
  """requirements.lock (what setup installs and the tests run on) is inside every declared range."""
  from packaging.requirements import Requirement
  lock = {}
  for line in (REPO / "requirements.lock").read_text().splitlines():
    line = line.split("#")[0].strip()
    if "==" in line:
      k, v = line.split("==", 1)
      lock[_norm(k)] = v.strip()
  proj = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  reqs = list(proj["dependencies"]) + [r for k, v in proj["optional-dependencies"].items() if k != "tpu" for r in v]
  bad = []
  for r in map(Requirement, reqs):
    if _norm(r.name) == "rsi-jax":
      continue
    if _norm(r.name) not in lock:
      bad.append(f"{r.name}: not in requirements.lock")
    elif not r.specifier.contains(lock[_norm(r.name)], prereleases=True):
      bad.append(f"{r}: lock has {lock[_norm(r.name)]}")
  assert not bad, bad


@pytest.mark.slow
@pytest.mark.network
def test_core_wheel_installs_alone_and_runs_a_scan_estimator_and_a_loss(tmp_path):
  """Build the wheel, install it with only its core dependencies (from the package index) into a fresh
  virtualenv, and run TB-GAE and the PPO loss there; MaxText and Docker are absent."""
  import shutil
  run = lambda *a, **kw: subprocess.run(a, check=True, capture_output=True, text=True, timeout=900, **kw)
  src = tmp_path / "src"  # a copy: setuptools writes build/ and *.egg-info/ next to the sources
  shutil.copytree(REPO / "rsi_jax", src / "rsi_jax", ignore=shutil.ignore_patterns("__pycache__"))
  for f in ("pyproject.toml", "README.md"):
    shutil.copy(REPO / f, src / f)
  run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"),
      str(src))
  wheel = next((tmp_path / "dist").glob("rsi_jax-*.whl"))
  venv = tmp_path / "venv"
  run(sys.executable, "-m", "venv", str(venv))
  py = str(venv / "bin" / "python")
  run(py, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel))
  script = """
import importlib.util, numpy as np, jax.numpy as jnp
from rsi_jax.rl import gae, tb_gae, ppo_policy_loss
v = jnp.array([[.5, .2, .1]]); r = jnp.array([[0., 0., 1.]]); done = jnp.array([[0, 0, 1]]); m = jnp.ones((1, 3))
adv, ret = gae(v, r, done, m, 1.0, 1.0)  # deltas -0.3, -0.1, 0.9 summed from the right
assert np.allclose(np.asarray(adv), [[0.5, 0.8, 0.9]]), adv
loss, metrics = ppo_policy_loss(jnp.zeros((1, 3)), jnp.zeros((1, 3)), adv, m)  # ratio 1: -mean(A)
assert np.isclose(float(loss), -(0.5 + 0.8 + 0.9) / 3) and float(metrics["ratio_max"]) == 1.0, (loss, metrics)
assert importlib.util.find_spec("maxtext") is None and importlib.util.find_spec("docker") is None
print("ok", ppo_policy_loss.__name__, tb_gae.__name__)
"""
  out = run(py, "-c", script, cwd=tmp_path).stdout
  assert out.startswith("ok")
