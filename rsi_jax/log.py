"""absl logging setup and a progress bar for long work (setup steps, image builds, training steps)."""

from __future__ import annotations

import gc
import logging as stdlib_logging
import sys
import traceback
from collections.abc import Iterable

from absl import logging
from tqdm import tqdm


def setup_logging(level: str = "info") -> None:
  logging.set_verbosity({"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
                         "error": logging.ERROR}[level])
  logging.use_absl_handler()


def progress(it: Iterable | None = None, desc: str = "", total: int | None = None, enabled: bool = True,
             file=None):
  """A tqdm bar on ``file`` (default stderr; ``run.progress``); with ``enabled=False`` a silent pass-through."""
  return tqdm(it, desc=desc, total=total, disable=not enabled, file=file or sys.stderr, dynamic_ncols=True,
              leave=False)


class LibraryOutputToFile:
  """Send everything libraries print (Python prints and logging, absl / Orbax INFO, XLA's C++ warnings on
  file descriptors 1 and 2) to ``path``, and keep the terminal for the run's own lines: ``console_out`` /
  ``console_err`` write to the original stdout / stderr. Restores both descriptors on exit. ``own_warnings``:
  this package's own warnings (loggers ``rsi_jax.*``, WARNING and above) also reach ``console_err``.

  Library objects finalized late also report to ``path``, not the terminal: on exit a garbage collection runs
  while the descriptors still point at the file, and afterwards "Exception ignored in ..." reports (Python's
  unraisable hook; e.g. the read coroutines Orbax abandons when a corrupted checkpoint fails to restore, closed
  at interpreter shutdown) are appended to it."""

  def __init__(self, path: str, own_warnings: bool = False):
    self.path = path
    self.own_warnings = own_warnings
    self._handler = None

  def __enter__(self):
    import os
    sys.stdout.flush()
    sys.stderr.flush()
    self._saved = (os.dup(1), os.dup(2))
    self.console_out = os.fdopen(os.dup(1), "w", buffering=1)
    self.console_err = os.fdopen(os.dup(2), "w", buffering=1)
    self._log = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed in __exit__
    os.dup2(self._log.fileno(), 1)
    os.dup2(self._log.fileno(), 2)
    if self.own_warnings:
      self._handler = stdlib_logging.StreamHandler(self.console_err)
      self._handler.setLevel(stdlib_logging.WARNING)
      self._handler.setFormatter(stdlib_logging.Formatter("%(levelname)s: %(message)s"))
      stdlib_logging.getLogger("rsi_jax").addHandler(self._handler)
    return self

  def __exit__(self, *exc):
    import os
    gc.collect()  # finalize what libraries left behind while their reports still reach the file
    if self._handler is not None:
      stdlib_logging.getLogger("rsi_jax").removeHandler(self._handler)
      self._handler = None
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(self._saved[0], 1)
    os.dup2(self._saved[1], 2)
    for fd in self._saved:
      os.close(fd)
    self._log.close()
    self.console_out.flush()
    self.console_err.flush()
    sys.unraisablehook = _AppendUnraisable(self.path, sys.unraisablehook)


class _AppendUnraisable:
  """``sys.unraisablehook`` appending each report to a log file (opened per report: the run's own handle is
  closed by then); a Ctrl-C, and a report the file cannot take, go to the hook before."""

  def __init__(self, path: str, before):
    self.path = path
    self.before = before.before if isinstance(before, _AppendUnraisable) else before  # no chain of log files

  def __call__(self, u) -> None:
    if u.exc_type is not None and issubclass(u.exc_type, KeyboardInterrupt):
      self.before(u)
      return
    try:
      lines = [f"{u.err_msg or 'Exception ignored in'}: {u.object!r}\n"]
      lines += traceback.format_exception(u.exc_type, u.exc_value, u.exc_traceback)
      with open(self.path, "a") as f:
        f.writelines(lines)
    except Exception:  # noqa: BLE001 - a report that cannot be written goes where Python puts it
      self.before(u)
