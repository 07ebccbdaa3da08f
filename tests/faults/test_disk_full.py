"""Fault: the run folder's file system fills up while a checkpoint is written (a real tmpfs of a fixed size).

The run stops with one line naming the disk-full write, the previous checkpoint stays whole (the resume verifies
it against its digests), and once the file system is made larger the same command resumes and finishes.
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.pipeline.test_resume import _start

pytestmark = [pytest.mark.slow, pytest.mark.docker]

SIZE_MB = 300  # a tiny-model checkpoint (params, optimizer states) is ~110 MB: the third one does not fit


@pytest.fixture
def small_fs():
  if os.geteuid() != 0 or not shutil.which("mount"):
    msg = "mounting a tmpfs needs root"
    if os.environ.get("RSI_REQUIRE_DOCKER") == "1":
      pytest.fail(msg)
    pytest.skip(msg)
  d = Path(tempfile.mkdtemp(prefix="rsi-full-"))
  subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE_MB}m", "tmpfs", str(d)], check=True)
  try:
    yield d
  finally:
    subprocess.run(["umount", "-l", str(d)], check=False)
    shutil.rmtree(d, ignore_errors=True)


RSR_ONLY = "pipeline.phases=[rsr1]"  # the disk fills inside RSR-1; the RPR phase after it adds nothing here


def test_disk_full_stops_with_the_path_keeps_the_last_checkpoint_and_resumes(small_fs, docker_client):
  p = _start(small_fs, "full", RSR_ONLY)
  out, err = p.communicate(timeout=900)
  assert p.returncode == 1, f"rc {p.returncode}\n{out}\n{err[-3000:]}"
  stopped = [x for x in out.splitlines() if x.startswith("run stopped")]
  assert len(stopped) == 1 and stopped[0].startswith("run stopped: no space left on device while writing "), out
  assert str(small_fs) in stopped[0]
  assert "Traceback" not in out + err
  ck = small_fs / "full" / "checkpoints" / "rsr1"
  done = sorted(int(x.name) for x in ck.iterdir() if x.name.isdigit())
  assert done, list(ck.iterdir())
  subprocess.run(["mount", "-o", f"remount,size={8 * SIZE_MB}m", str(small_fs)], check=True)
  out2, err2 = _start(small_fs, "full", RSR_ONLY).communicate(timeout=900)
  assert f"[rsr1] resuming after step {done[-1]}" in out2, out2 + err2[-3000:]
  assert "done in" in out2 and "refused" not in out2, out2
