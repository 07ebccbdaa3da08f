"""Process-wide teardown: the labels that mark every container, this process's live sandboxes, reaping.

Every container carries the labels below (its run, task, episode and owning host and pid). The live
sandboxes of this process are removed at exit, and :func:`install_signal_handlers` turns SIGTERM into
SystemExit so teardown runs; :func:`reap_containers` removes one run's (or every run's) containers and
:func:`reap_orphans` what crashed runs on this host left behind.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import threading

import docker.errors

log = logging.getLogger(__name__)

LABEL_RUN = "rsi_jax.run"
LABEL_TASK = "rsi_jax.task"
LABEL_EPISODE = "rsi_jax.episode"
LABEL_HOST = "rsi_jax.host"
LABEL_PID = "rsi_jax.pid"

# This process's started, not yet closed sandboxes: {container id: rsi_jax.env.sandbox.DockerSandbox}.
_LIVE: dict[str, "DockerSandbox"] = {}
_LIVE_LOCK = threading.Lock()


def _remove_all_live():
  with _LIVE_LOCK:
    boxes = list(_LIVE.values())
  for b in boxes:
    b.close()


atexit.register(_remove_all_live)


def install_signal_handlers():
  """Turn SIGTERM into SystemExit so ``finally`` / ``with`` teardown runs (SIGINT already raises
  KeyboardInterrupt). Only possible from the main thread; a no-op elsewhere."""
  if threading.current_thread() is not threading.main_thread():
    return

  def _raise(signum, frame):
    raise SystemExit(128 + signum)

  if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
    signal.signal(signal.SIGTERM, _raise)


def reap_containers(client, run_id: str | None = None) -> int:
  """Remove every container labelled by rsi_jax (or by one run). Returns how many were removed."""
  label = LABEL_RUN if run_id is None else f"{LABEL_RUN}={run_id}"
  n = 0
  for c in client.containers.list(all=True, filters={"label": label}, ignore_removed=True):
    try:
      c.remove(force=True)
      n += 1
    except docker.errors.NotFound:
      pass
  return n


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def reap_orphans(client) -> int:
  """Remove labelled containers whose owning process (on this host) no longer runs: what crashed runs
  left behind. Containers owned by live processes or other hosts are kept."""
  n = 0
  me = socket.gethostname()
  for c in client.containers.list(all=True, filters={"label": LABEL_RUN}, ignore_removed=True):
    labels = c.labels or {}
    try:
      pid = int(labels.get(LABEL_PID, "0"))
    except ValueError:
      pid = 0
    if labels.get(LABEL_HOST) == me and pid > 0 and _pid_alive(pid):
      continue
    if labels.get(LABEL_HOST) not in (me, None):
      continue
    try:
      c.remove(force=True)
      n += 1
    except docker.errors.NotFound:
      pass
  if n:
    log.warning("removed %d container(s) left by crashed runs", n)
  return n
