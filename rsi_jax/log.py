"""absl logging setup and a progress bar for long work (setup steps, image builds, training steps)."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from absl import logging
from tqdm import tqdm


def setup_logging(level: str = "info") -> None:
  logging.set_verbosity({"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
                         "error": logging.ERROR}[level])
  logging.use_absl_handler()


def progress(it: Iterable | None = None, desc: str = "", total: int | None = None, enabled: bool = True):
  """A tqdm bar on stderr (``run.progress``); with ``enabled=False`` a silent pass-through."""
  return tqdm(it, desc=desc, total=total, disable=not enabled, file=sys.stderr, dynamic_ncols=True,
              leave=True)
