"""Checks the ERROR summaries against counts recomputed from a pristine copy of the log (6 checks)."""

import re
from collections import Counter
from pathlib import Path

LOG = Path(__file__).with_name("app.log")  # the verifier's own copy, not the agent's


def reference():
  by_component, by_hour = Counter(), Counter()
  for line in LOG.read_text().splitlines():
    stamp, level, component, _ = line.split(" ", 3)
    if level == "ERROR":
      by_component[component.strip("[]")] += 1
      by_hour[stamp[11:13]] += 1
  return by_component, by_hour


def read_pairs(path):
  p = Path(path)
  assert p.is_file(), f"{path} is missing"
  return [line.split(" ") for line in p.read_text().splitlines()]


def test_summary_format():
  rows = read_pairs("/app/error_summary.txt")
  assert rows, "summary is empty"
  for row in rows:
    assert len(row) == 2 and re.fullmatch(r"[0-9]+", row[0]) and re.fullmatch(r"[a-z]+", row[1]), row


def test_summary_components():
  want, _ = reference()
  assert {row[1] for row in read_pairs("/app/error_summary.txt")} == set(want)


def test_summary_counts():
  want, _ = reference()
  got = {row[1]: int(row[0]) for row in read_pairs("/app/error_summary.txt")}
  assert got == dict(want)


def test_summary_order():
  want, _ = reference()
  order = [c for c, _ in sorted(want.items(), key=lambda kv: (-kv[1], kv[0]))]
  assert [row[1] for row in read_pairs("/app/error_summary.txt")] == order


def test_hours_counts():
  _, want = reference()
  got = {row[0].zfill(2): int(row[1]) for row in read_pairs("/app/error_hours.txt")}
  assert got == dict(want)


def test_hours_format_and_order():
  _, want = reference()
  rows = read_pairs("/app/error_hours.txt")
  assert [row[0] for row in rows] == sorted(want), "hours must be two digits, in order"
