"""One command-line convention for every entry point: absl flags with underscore names (plus ``key=value`` config
overrides), ``--help`` lists the flags (exit 0), an unknown flag or an old spelling is one line and exit 2, and a
usage error is found before any work."""

import ast
import importlib
import os
import subprocess
import sys

import pytest

from rsi_jax.config import REPO_ROOT

# python -m <entry point> -> the flags it takes
ENTRY_POINTS = {
    "rsi_jax.train": {"config", "distributed"},
    "rsi_jax.eval": {"config", "tasks_dir", "harness", "repeats", "checkpoint", "tasks", "output", "strict"},
    "rsi_jax.view": {"port", "host"},
    "rsi_jax.rsr": {"config", "checkpoint", "phase", "distributed"},
    "rsi_jax.eval.report": {"runs", "names", "run_dir", "output"},
    "rsi_jax.models.export": {"checkpoint", "out", "maxtext_out", "config"},
    "rsi_jax.pipeline.compile_plan": {"config", "topology", "hbm_gib", "json", "programs"},
    "rsi_jax.rl.calibrate": {"trajectories", "out", "table", "quantile", "min_samples", "fallback_divisor", "config",
                             "source", "phase"},
    "rsi_jax.rl.rescore": {"trajectories", "reward", "fallback_divisor", "json", "plot"},
}


def _module(name):
  path = REPO_ROOT / (name.replace(".", "/") + ".py")
  return importlib.import_module(name if path.exists() else name + ".__main__")


def _exit(name, argv, capsys):
  """(exit status, stdout, stderr lines) of the entry point's main on ``argv``."""
  with pytest.raises(SystemExit) as e:
    rc = _module(name).main(argv)
    raise SystemExit(rc)
  out, err = capsys.readouterr()
  return e.value.code, out, [x for x in err.splitlines() if x.strip()]


def test_every_entry_point_is_listed_and_none_uses_argparse():
  found = set()
  for f in (REPO_ROOT / "rsi_jax").rglob("*.py"):
    text = f.read_text()
    mod = ".".join(f.relative_to(REPO_ROOT).with_suffix("").parts)
    if f.name == "__main__.py":
      found.add(mod.removesuffix(".__main__"))
    elif any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in ast.parse(text).body):
      found.add(mod)
    assert "argparse" not in text, f"{mod} parses its command line with argparse"
  assert found == set(ENTRY_POINTS)


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_help_lists_the_flags_and_exits_0(name, capsys):
  rc, out, err = _exit(name, ["--help"], capsys)
  assert rc == 0 and not err
  listed = {x.split()[0].split("=")[0].removeprefix("--") for x in out.splitlines() if x.startswith("  --")}
  assert listed == ENTRY_POINTS[name]
  assert f"python -m {name}" in out  # the usage from the module's docstring
  assert "Exit status" in out or "exit status" in out


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_unknown_flag_is_one_line_and_exit_2(name, capsys):
  rc, out, err = _exit(name, ["--no_such_flag=1"], capsys)
  assert rc == 2 and out == ""
  assert len(err) == 1 and "no_such_flag" in err[0] and err[0].startswith(f"python -m {name}: ")


@pytest.mark.parametrize("name, argv, hint", [
    ("rsi_jax.pipeline.compile_plan", ["--config=configs/smoke.yml", "--hbm-gib=16"], "--hbm-gib is now --hbm_gib"),
    ("rsi_jax.models.export", ["--checkpoint=ckpt", "--maxtext-out=mt"], "--maxtext-out is now --maxtext_out"),
    ("rsi_jax.rl.calibrate", ["fdr", "--trajectories=t.jsonl", "--out=f.json", "--min-samples", "2"],
     "--min-samples is now --min_samples"),
    ("rsi_jax.rl.calibrate", ["show", "spr.json"], "give the table as --table=spr.json"),
    ("rsi_jax.rl.rescore", ["t.jsonl"], "give the trajectory table as --trajectories=t.jsonl"),
    ("rsi_jax.rl.rescore", ["--trajectories=t.jsonl", "--fallback-divisor=82"],
     "--fallback-divisor is now --fallback_divisor"),
    ("rsi_jax.eval.report", ["--run-dir=runs/smoke"], "--run-dir is now --run_dir"),
    ("rsi_jax.eval", ["--tasks-dir=tasks"], "--tasks-dir is now --tasks_dir"),
])
def test_old_spelling_exits_2_with_the_new_flag(name, argv, hint, capsys):
  rc, out, err = _exit(name, argv, capsys)
  assert rc == 2 and out == ""
  assert len(err) == 1 and hint in err[0], err


def test_report_over_stage_folders_needs_an_output_folder(tmp_path, monkeypatch, capsys):
  """No report folder appears in the working directory (the repository) by default."""
  monkeypatch.chdir(tmp_path)
  rc, _, err = _exit("rsi_jax.eval.report", [f"--runs={tmp_path}/a,{tmp_path}/b"], capsys)
  assert rc == 2 and len(err) == 1 and "--output: required with --runs" in err[0]
  assert list(tmp_path.iterdir()) == []


def test_python_m_usage_errors_before_any_work(tmp_path):
  """Through ``python -m``: an unknown flag, an old spelling, and an evaluation whose ``--output`` names an existing
  file, each exit 2 with one line at once (the evaluation before its suite folder is even looked at)."""
  existing = tmp_path / "summary.txt"
  existing.write_text("not a folder\n")
  runs = {
      "unknown": ["rsi_jax.train", "--no_such_flag"],
      "old": ["rsi_jax.pipeline.compile_plan", "--config=configs/smoke.yml", "--hbm-gib=16"],
      "output": ["rsi_jax.eval", f"--output={existing}", f"--tasks_dir={tmp_path}/none"],
  }
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  procs = {k: subprocess.Popen([sys.executable, "-m", *a], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env) for k, a in runs.items()}
  res = {}
  for k, p in procs.items():
    out, err = p.communicate(timeout=120)
    res[k] = (p.returncode, out, [x for x in err.splitlines() if x.strip()])
  for k, (rc, out, err) in res.items():
    assert rc == 2 and out == "" and len(err) == 1, (k, rc, out, err)
  assert "Unknown command line flag 'no_such_flag'" in res["unknown"][2][0]
  assert "--hbm-gib is now --hbm_gib" in res["old"][2][0]
  assert f"--output: {existing} is an existing file, not a folder" in res["output"][2][0]
  assert existing.read_text() == "not a folder\n"


@pytest.mark.docker
def test_eval_builds_its_model_with_no_device_flags_and_keeps_library_logging_off(tmp_path, docker_client):
  """The README's evaluation command with no XLA_FLAGS or JAX_PLATFORMS: the process gives the CPU backend the
  smoke mesh's 4 devices and builds the actor on them; library logging (xla_bridge, transformers, max_utils) goes
  to the log, so a checkpoint that is not there is the console's only line."""
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  p = subprocess.run([sys.executable, "-m", "rsi_jax.eval", "--config=configs/smoke.yml",
                      f"--checkpoint={tmp_path}/none", "--tasks=data-aggregation-course-grades"], cwd=REPO_ROOT,
                     capture_output=True, text=True, timeout=300, env=env)
  assert p.returncode == 2 and p.stdout == ""
  assert p.stderr.splitlines() == [f"cannot evaluate: checkpoint {tmp_path}/none: does not exist"]
