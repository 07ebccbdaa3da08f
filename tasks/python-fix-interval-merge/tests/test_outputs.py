"""Runs the repaired intervals.py on hand-checked bookings (10 checks)."""

import copy
import importlib
import sys

import pytest

sys.path.insert(0, "/app")


def module():
  import intervals
  return importlib.reload(intervals)


@pytest.mark.parametrize("given, want", [
  ([(5, 8), (1, 3)], [(1, 3), (5, 8)]),
  ([(1, 3), (3, 5), (7, 9)], [(1, 5), (7, 9)]),
  ([(1, 10), (2, 4), (6, 8)], [(1, 10)]),
  ([(6, 7), (1, 2), (2, 6), (9, 9)], [(1, 7), (9, 9)]),
  ([(2, 2), (1, 2), (0, 1)], [(0, 2)]),
])
def test_merge(given, want):
  got = module().merge(given)
  assert got == want and all(type(iv) is tuple for iv in got)


def test_merge_leaves_input_alone():
  given = [[4, 6], [1, 5], [5, 9]]
  before = copy.deepcopy(given)
  module().merge(given)
  assert given == before


@pytest.mark.parametrize("given, want", [([(1, 3), (2, 6), (10, 12)], 7), ([(0, 60), (15, 30)], 60)])
def test_total_length(given, want):
  assert module().total_length(given) == want


@pytest.mark.parametrize("given, lo, hi, want", [
  ([(540, 600), (660, 720), (600, 630)], 480, 780, [(480, 540), (630, 660), (720, 780)]),
  ([(400, 500), (700, 900), (550, 560)], 480, 800, [(500, 550), (560, 700)]),
])
def test_free_slots(given, lo, hi, want):
  assert module().free_slots(given, lo, hi) == want
