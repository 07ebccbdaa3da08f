"""``python -m rsi_jax.rsr``: one RSR phase standalone, the training program's own code."""

import json
import os
import subprocess
import sys

import pytest

from rsi_jax.config import REPO_ROOT


def _rsr(*args, timeout=900):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "rsi_jax.rsr", *args], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=timeout, env=env)


def test_cli_rejects_a_phase_that_is_not_rsr_and_bad_keys(tmp_path):
  p = _rsr("--phase=rpr1", f"run.output_dir={tmp_path}", timeout=120)
  assert p.returncode == 2 and "--phase: 'rpr1' is not an RSR phase" in p.stderr
  p = _rsr("rsr.num_repeat=2", timeout=120)
  assert p.returncode == 2 and "rsr.num_repeat: unknown config key" in p.stderr


@pytest.mark.slow
@pytest.mark.docker
def test_real_tiny_actor_runs_the_funnel_and_reports_it(tmp_path, docker_client):
  """The real (random-init) tiny MaxText actor behind the sampler: discovery under both harnesses on two
  tasks; it verifies nothing at this size, so Q_clean is empty, the table says why, and the phase ends
  with the actor unchanged (a step-0 checkpoint of its input)."""
  p = _rsr("--config=configs/smoke.yml", f"run.output_dir={tmp_path}", "rsr.policy=actor", "env.max_tasks=2",
           "rollout.max_new_tokens=8", "env.max_turns=1", "run.progress=false")
  assert p.returncode == 0, p.stdout + p.stderr
  run_dir = tmp_path / "smoke-rsr1"
  manifest = json.loads((run_dir / "phases" / "rsr1" / "rsr_manifest.json").read_text())
  st = manifest["stages"]
  assert manifest["policy"] == "the actor" and st["attempted"] == 4
  assert "RSR funnel (the actor)" in p.stdout and "attempted" in p.stdout
  # a random-init actor with 8 new tokens per turn cannot write a verified solution
  assert st["discovered"] == st["accepted"] == 0
  assert "Q_clean is empty: no discovery episode verified (4 attempted)" in p.stdout
  (entry,) = json.loads((run_dir / "lineage.json").read_text())
  assert entry["steps"] == 0 and entry["output"].endswith("checkpoints/rsr1/0")
  assert entry["rsr"]["q_clean"] == 0 and entry["critic_digest"] is None
  assert entry["actor_digest"] == entry["rsr"]["input_actor_digest"]  # unchanged
