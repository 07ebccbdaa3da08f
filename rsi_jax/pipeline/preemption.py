"""Preemption: a SIGTERM (a pod preemption notice) or Ctrl-C stops a run at its next safe point, checkpointed.

:class:`Stop` is the notice the driver installs for the run (long waits end early on it, :mod:`rsi_jax.stop`);
:class:`Preempted` is how the run then ends: the newest state is on storage and the same command resumes it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from rsi_jax.pipeline import multihost


class Preempted(Exception):
  """SIGTERM (or Ctrl-C): the newest state is on storage (``args[0]``: its checkpoint folder, or with
  ``saved=False`` where the interrupted phase starts from again: no step of it had finished)."""

  def __init__(self, where: str, signal_name: str = "SIGTERM", saved: bool = True):
    super().__init__(where)
    self.signal_name, self.saved = signal_name, saved

  def message(self) -> str:
    what = (f"checkpoint written to {self.args[0]}" if self.saved
            else f"no step of the phase had finished (it starts again from {self.args[0]})")
    return f"preempted ({self.signal_name}): {what}; rerun the same command to resume"


class Stop:
  """SIGTERM (a pod preemption notice) or Ctrl-C -> stop at the next safe point with a checkpoint. Multi-host: a
  notice any process got stops every process at the same point (the flags are exchanged there). A second
  Ctrl-C raises KeyboardInterrupt at once."""

  SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}

  def __init__(self, budget_s: float = 0.0, console=None):
    self.requested = False
    self.signal_name = "SIGTERM"
    self.budget_s, self.console = budget_s, console
    self._old = {}
    self._timer = None

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._old = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
    return self

  def _handle(self, signum, frame):
    if self.requested and signum == signal.SIGINT:
      raise KeyboardInterrupt
    if not self.requested and self.budget_s > 0:
      self._timer = threading.Timer(self.budget_s, self._expire)
      self._timer.daemon = True
      self._timer.start()
    self.requested = True
    self.signal_name = self.SIGNALS.get(signum, "SIGTERM")

  def _expire(self):
    """run.preempt_budget_s passed since the notice and the run has not stopped: end the process now. The
    newest complete checkpoint is on storage (a step folder appears only once whole), so the rerun resumes."""
    from rsi_jax.env.reaper import _remove_all_live
    msg = (f"preempted ({self.signal_name}): still stopping after run.preempt_budget_s={self.budget_s:g} s: "
           f"ended now; rerun the same command to resume from the newest complete checkpoint")
    try:
      logging.error(msg)
      if self.console is not None:
        self.console.line(msg)
      _remove_all_live()  # the episodes' containers (os._exit skips the atexit teardown)
    finally:
      os._exit(130 if self.signal_name == "Ctrl-C" else 0)

  def __exit__(self, *exc):
    for s, old in self._old.items():
      signal.signal(s, old)
    self._old = {}
    if self._timer is not None and exc[0] is None:  # the run ended on its own; a stopping run keeps the limit
      self._timer.cancel()                           # through its teardown (the pool, the sampler)

  def now(self) -> bool:
    return any(multihost.gather_objects([self.requested]))
