"""Fault fixtures: a second, real Docker daemon (``second_daemon``).

It runs beside the main one with its own data root, exec root, socket and containerd, without iptables or a
bridge (its containers run with ``--network none``), and gets the ``rsi-base`` image from the main daemon
(``docker save | docker load``). Tests stop it for real (SIGTERM to its pid, as ``kill`` does) and start it
again on the same data root. Without root or a ``dockerd`` binary the tests that use it are skipped, or FAIL
when ``RSI_REQUIRE_DOCKER=1`` (as ``docker_client`` in tests/conftest.py).
"""

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def _skip_or_fail(msg: str):
  if os.environ.get("RSI_REQUIRE_DOCKER") == "1":
    pytest.fail(msg)
  pytest.skip(msg)


class SecondDaemon:
  """A ``dockerd`` on ``unix://<root>/docker.sock`` (a short root: socket paths have a length limit)."""

  def __init__(self, dockerd: str, root: Path):
    self.dockerd, self.root = dockerd, root
    self.sock = root / "docker.sock"
    self.host = f"unix://{self.sock}"
    self.pidfile = root / "docker.pid"
    self.log = root / "dockerd.log"
    self.proc: subprocess.Popen | None = None

  def running(self) -> bool:
    return self.proc is not None and self.proc.poll() is None

  def start(self, timeout_s: float = 60.0):
    """Start it (the same data root every time) and wait until it answers a ping."""
    import docker
    if self.running():
      return
    cmd = [self.dockerd, "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
           "--pidfile", str(self.pidfile), "-H", self.host, "--iptables=false", "--ip6tables=false",
           "--bridge=none", "--storage-driver=overlay2",
           "--shutdown-timeout=1"]  # its containers ignore SIGTERM (PID 1 is a bash): killed after 1 s
    with open(self.log, "ab") as log:
      self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    t0 = time.time()
    while time.time() - t0 < timeout_s:
      if self.proc.poll() is not None:
        break
      try:
        c = docker.DockerClient(base_url=self.host, timeout=5)
        c.ping()
        c.close()
        return
      except Exception:  # noqa: BLE001 - not up yet
        time.sleep(0.3)
    tail = self.log.read_text(errors="replace")[-1500:]
    self.stop()
    raise RuntimeError(f"the second dockerd did not answer within {timeout_s:g} s:\n{tail}")

  def kill(self, timeout_s: float = 60.0):
    """``kill $(cat docker.pid)`` and wait until the daemon is gone (its socket is removed then)."""
    pid = int(self.pidfile.read_text().strip())
    os.kill(pid, signal.SIGTERM)
    self.proc.wait(timeout=timeout_s)

  def stop(self):
    """Whatever state it is in: stopped, its process group ended, its mounts undone."""
    if self.running():
      try:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        pass
    if self.proc is not None:
      try:  # the daemon's own containerd and shims, if the daemon did not end them
        os.killpg(self.proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      self.proc.wait(timeout=30)
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(str(self.root) + "/")), key=len, reverse=True):
      subprocess.run(["umount", "-l", m], check=False, capture_output=True)

  def client(self):
    from rsi_jax.env.sandbox import docker_client
    return docker_client(self.host)


@pytest.fixture(scope="session")
def second_daemon(docker_client):
  """A second real Docker daemon with the ``rsi-base`` image; stopped and its folder removed at the end."""
  if os.geteuid() != 0:
    _skip_or_fail("a second Docker daemon needs root")
  dockerd = shutil.which("dockerd")
  if dockerd is None or shutil.which("docker") is None:
    _skip_or_fail("no dockerd / docker binary to start a second Docker daemon (scripts/docker_up.sh installs them)")
  root = Path(tempfile.mkdtemp(prefix="rsi-d2-", dir="/tmp"))
  d = SecondDaemon(dockerd, root)
  try:
    try:
      d.start()
    except RuntimeError as e:
      _skip_or_fail(str(e))
    save = subprocess.Popen(["docker", "save", "rsi-base"], stdout=subprocess.PIPE)  # from the main daemon
    load = subprocess.run(["docker", "load", "-q"], stdin=save.stdout, capture_output=True,
                          env=dict(os.environ, DOCKER_HOST=d.host))
    save.stdout.close()
    if save.wait() != 0 or load.returncode != 0:
      raise RuntimeError(f"could not copy rsi-base to the second daemon: {load.stderr.decode()[-500:]}")
    yield d
  finally:
    d.stop()
    shutil.rmtree(root, ignore_errors=True)
