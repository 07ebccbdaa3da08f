"""The training entry point validates its config before building anything."""

import subprocess
import sys

from rsi_jax.config import REPO_ROOT


def _run(*args):
  return subprocess.run([sys.executable, "-m", "rsi_jax.train", *args], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=120)


def test_train_rejects_unknown_key_and_bad_value():
  p = _run("--config=configs/smoke.yml", "actor_optim.lr=1e-7")
  assert p.returncode == 2 and "actor_optim.lr: unknown config key" in p.stderr
  p = _run("--config=configs/smoke.yml", "critic_optim.learning_rate=-3")
  assert p.returncode == 2 and "critic_optim.learning_rate: must be >= 0" in p.stderr
  p = _run("--config=configs/nope.yml")
  assert p.returncode == 2 and "does not exist" in p.stderr
