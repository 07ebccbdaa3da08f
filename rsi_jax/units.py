"""Sizes written as text (``"2G"``, ``"512M"``, ``"1.5GiB"``, or a number of MB) -> bytes."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "ki": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20,
          "mi": 2**20, "mib": 2**20, "g": 2**30, "gb": 2**30, "gi": 2**30, "gib": 2**30}


def parse_memory(v) -> int:
  """``"2G"`` / ``"512M"`` / ``"1.5GiB"`` / an int of MB -> bytes. Raises ValueError."""
  if isinstance(v, bool):
    raise ValueError(f"not a memory size: {v!r}")
  if isinstance(v, (int, float)):
    return int(v * 2**20)  # a bare number is megabytes (Harbor's memory_mb)
  m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(v))
  if not m or m.group(2).lower() not in _UNITS:
    raise ValueError(f"not a memory size: {v!r}")
  return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
