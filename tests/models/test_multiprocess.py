"""The same sharded actor+critic step under jax.distributed (2 processes x 4 CPU devices, gloo on loopback)
gives the single-process 8-device losses; HF import and param checkpoints work across the two processes."""

import os
import sys

import numpy as np
import pytest

from tests.models import mp_worker
from tests.processes import cpu_env, free_port, run_all


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_process_step_matches_single_process(tmp_path):
  port = free_port()
  script = os.path.join(os.path.dirname(__file__), "mp_worker.py")
  ckpt = str(tmp_path / "ckpt")
  done = run_all([([sys.executable, script, str(port), str(i), ckpt], cpu_env(4)) for i in range(2)], 600)
  outs = [out for _, out in done]
  for rc, out in done:
    assert rc == 0, out[-3000:]
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
