"""JSON lines read leniently: the records of a text, a line that does not parse (cut by a kill mid-write, a file
still being written) dropped."""

from __future__ import annotations

import json


def parse_lines(text: str) -> list:
  """Every non-blank line of ``text`` that parses as JSON, in order; the others are dropped."""
  out = []
  for line in text.splitlines():
    if line.strip():
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError:
        pass
  return out
