"""Meeting-room bookings as closed intervals [start, end] of minutes, start <= end.

Used by the room scheduler; every function takes a list of (start, end) pairs in any order.
"""


def merge(intervals):
  """Returns the union of `intervals` as a list of disjoint (start, end) tuples sorted by start.

  Intervals that overlap or touch (share an endpoint, like (1, 3) and (3, 5)) become one interval.
  The input list and its items are not modified.
  """
  merged = []
  for iv in intervals:
    if merged and iv[0] < merged[-1][1]:
      merged[-1][1] = iv[1]
    else:
      merged.append(iv)
  return merged


def total_length(intervals):
  """Total length (sum of end - start) of the union of `intervals`."""
  return sum(end - start for start, end in intervals)


def free_slots(intervals, lo, hi):
  """Gaps of positive length inside [lo, hi] not covered by `intervals`, as sorted (start, end) tuples."""
  slots = []
  cursor = lo
  for start, end in merge(intervals):
    if start > cursor:
      slots.append((cursor, start))
    cursor = end
  if cursor < hi:
    slots.append((cursor, hi))
  return slots
