"""The training entry point validates its config and the machine before building anything, and gives a CPU
backend the devices the mesh asks for."""

import os
import subprocess
import sys

from rsi_jax.config import REPO_ROOT


def _run(*args, **env):
  return subprocess.run([sys.executable, "-m", "rsi_jax.train", *args], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=120, env=dict(os.environ, **env))


def test_train_rejects_unknown_key_and_bad_value():
  p = _run("--config=configs/smoke.yml", "actor_optim.lr=1e-7")
  assert p.returncode == 2 and "actor_optim.lr: unknown config key" in p.stderr
  p = _run("--config=configs/smoke.yml", "critic_optim.learning_rate=-3")
  assert p.returncode == 2 and "critic_optim.learning_rate: must be >= 0" in p.stderr
  p = _run("--config=configs/nope.yml")
  assert p.returncode == 2 and "does not exist" in p.stderr


def test_plain_train_gives_itself_the_cpu_devices_its_mesh_needs(tmp_path):
  """`python -m rsi_jax.train` (the smoke config's 2 x 2 mesh) with no device count set: the process gives its CPU
  backend the 4 devices, so the pre-flight checks pass the mesh and stop at the next fault given (a missing
  divisor table: exit 2, one line); on 1 device the mesh check would stop it first."""
  p = _run(f"run.output_dir={tmp_path}", "reward.divisor_table=/nonexistent.json", XLA_FLAGS="", JAX_PLATFORMS="cpu")
  assert p.returncode == 2, p.stderr
  lines = [x for x in p.stderr.splitlines() if x.strip()]
  assert len(lines) == 1 and lines[0].startswith("cannot start: reward.divisor_table: "), lines
  assert p.stdout == ""


def test_train_on_a_device_count_that_does_not_fit_says_why_in_one_line(tmp_path):
  """A device count set by hand (XLA_FLAGS) is kept: exit 2 and one line naming the mesh key and the flag that
  gives more devices, before any model is built."""
  p = _run(f"run.output_dir={tmp_path}", XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
  assert p.returncode == 2, p.stderr
  lines = [x for x in p.stderr.splitlines() if x.strip()]
  assert len(lines) == 1 and lines[0].startswith("cannot start: mesh.ici_")
  assert "xla_force_host_platform_device_count" in lines[0] and "has 1" in lines[0]
  assert p.stdout == ""


_COUNT_PREFLIGHTS = """
import sys
import rsi_jax.pipeline.driver  # imported before the patch: the call sites must look preflight up when called
import rsi_jax.pipeline.plan as plan
from rsi_jax import train
calls, check = [], plan.preflight
def counted(*a, **k):
  calls.append(1)
  return check(*a, **k)
plan.preflight = counted
rc = train.run_program("configs/smoke.yml", sys.argv[1:])
print(f"preflights={len(calls)} rc={rc}")
"""


def test_the_pre_flight_checks_run_once_per_start(tmp_path):
  """train checks the config and the machine once: the Driver takes the plan those checks returned instead of
  checking again. The start is stopped by the first check that needs the run folder (a resume whose config
  differs), so no model is built."""
  run = tmp_path / "smoke"
  run.mkdir()
  (run / "metrics.jsonl").write_text("")  # an earlier run is there
  (run / "config.yml").write_text("rollout:\n  global_batch: 12345\n")
  p = subprocess.run([sys.executable, "-c", _COUNT_PREFLIGHTS, f"run.output_dir={tmp_path}", "run.name=smoke"],
                     cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                     env=dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu"))
  assert p.stdout.strip().splitlines()[-1] == "preflights=1 rc=2", p.stdout + p.stderr[-3000:]
  assert "rollout.global_batch: 12345 ->" in p.stderr, p.stderr[-3000:]
