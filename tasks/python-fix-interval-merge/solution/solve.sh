#!/bin/bash
set -euo pipefail
cat > /app/intervals.py <<'PY'
"""Meeting-room bookings as closed intervals [start, end] of minutes, start <= end.

Used by the room scheduler; every function takes a list of (start, end) pairs in any order.
"""


def merge(intervals):
  """Returns the union of `intervals` as a list of disjoint (start, end) tuples sorted by start.

  Intervals that overlap or touch (share an endpoint, like (1, 3) and (3, 5)) become one interval.
  The input list and its items are not modified.
  """
  merged = []
  for start, end in sorted(tuple(iv) for iv in intervals):
    if merged and start <= merged[-1][1]:
      merged[-1] = (merged[-1][0], max(merged[-1][1], end))
    else:
      merged.append((start, end))
  return merged


def total_length(intervals):
  """Total length (sum of end - start) of the union of `intervals`."""
  return sum(end - start for start, end in merge(intervals))


def free_slots(intervals, lo, hi):
  """Gaps of positive length inside [lo, hi] not covered by `intervals`, as sorted (start, end) tuples."""
  slots = []
  cursor = lo
  for start, end in merge(intervals):
    if end <= cursor:
      continue
    if start >= hi:
      break
    if start > cursor:
      slots.append((cursor, start))
    cursor = max(cursor, end)
  if cursor < hi:
    slots.append((cursor, hi))
  return slots
PY
