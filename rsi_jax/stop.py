"""Stop notices (SIGTERM, Ctrl-C) seen by long waits: a rollout step, the RSR funnel's stages, an evaluation.

The driver owns the notice (an object with ``requested: bool`` and ``signal_name: str``, set from its signal
handler); a stage that waits for episodes calls :func:`wait_all` with it, which returns the results or, once the
notice is there, aborts what runs (abort switches set, queued episodes cancelled), waits until nothing is left
running (every container removed) and raises :class:`StopRequested`.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Sequence


class StopRequested(Exception):
  """A stop notice arrived while a stage waited for episodes; they were aborted and the stage left unfinished
  (``args[0]``: the signal's name). The driver checkpoints the newest complete state and stops."""


def wait_all(futs: Sequence[cf.Future], stop=None, aborts: Sequence[threading.Event] = (), poll: float = 0.1):
  """``[f.result() for f in futs]``, unless ``stop.requested`` turns true first: then every event in ``aborts``
  is set, queued futures are cancelled, running ones waited for, and :class:`StopRequested` is raised."""
  futs = list(futs)
  if stop is None:
    return [f.result() for f in futs]
  while True:
    done, pending = cf.wait(futs, timeout=poll)
    if not pending:
      return [f.result() for f in futs]
    if stop.requested:
      abort_all(pending, aborts)
      raise StopRequested(stop.signal_name)


def abort_all(futs, aborts: Sequence[threading.Event] = ()):
  """Stop what ``futs`` still run: every event in ``aborts`` set (a running episode's container removed, its
  sampler request cancelled), queued futures cancelled, running ones waited for."""
  for ev in aborts:
    ev.set()
  futs = [f for f in futs if not f.cancel()]
  cf.wait(futs)
