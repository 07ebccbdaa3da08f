"""The same sharded actor+critic step under jax.distributed (2 processes x 4 CPU devices, gloo on loopback)
gives the single-process 8-device losses; HF import and param checkpoints work across the two processes."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.models import mp_worker

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_process_step_matches_single_process(tmp_path):
  port = _free_port()
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
             PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  script = os.path.join(os.path.dirname(__file__), "mp_worker.py")
  ckpt = str(tmp_path / "ckpt")
  procs = [subprocess.Popen([sys.executable, script, str(port), str(i), ckpt], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outs = []
  try:
    for p in procs:
      out, _ = p.communicate(timeout=600)
      outs.append(out)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  got = [[float(x) for x in next(l for l in out.splitlines() if l.startswith("LOSS")).split()[1:]]
         for out in outs]
  np.testing.assert_allclose(got[0], got[1], rtol=0, atol=0)  # both processes see the same replicated loss
  want = mp_worker.joint_step_losses()  # this process: 8 fake devices (tests/conftest.py)
  np.testing.assert_allclose(got[0], want, rtol=2e-5)
  # HF import (each process places its own shards) and a checkpoint written / read by both processes
  for out in outs:
    hf_err, ckpt_err = (float(x) for x in next(l for l in out.splitlines() if l.startswith("CHECKS")).split()[1:])
    assert hf_err < 1e-4 and ckpt_err == 0.0
    assert "DCN 1" in out
