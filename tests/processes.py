"""Tests that launch several JAX processes (multi-controller, gloo on loopback): a free coordinator port and
a launcher that never leaves a process behind."""

import os
import socket
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def cpu_env(devices: int, **extra) -> dict:
  """This environment with ``devices`` virtual CPU devices and the checkout first on the import path."""
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
             PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
  return env


def run_all(commands: list[tuple[list[str], dict]], timeout: float = 900) -> list[tuple[int, str]]:
  """Start every (argv, env) at once; (return code, combined output) of each. Any still running when the
  first times out is killed."""
  procs = [subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for argv, env in commands]
  try:
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outs)]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
