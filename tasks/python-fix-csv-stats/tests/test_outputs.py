"""Runs the repaired stats.py on small tables with hand-computed statistics (10 checks)."""

import importlib
import subprocess
import sys

import pytest

sys.path.insert(0, "/app")


def module():
  import stats
  return importlib.reload(stats)


@pytest.mark.parametrize("rows, column, want", [
  ([["a", "b"], ["1", "2"], ["3", "4"]], "b", [2.0, 4.0]),
  ([["name", "price"], ["x", "2.5"], ["y", ""], ["z", "n/a"], ["w", "-1e3"]], "price", [2.5, -1000.0]),
  ([["id", "qty", "note"], ["1", "5"], ["2"], ["3", "7", "ok"]], "qty", [5.0, 7.0]),
])
def test_parse_column(rows, column, want):
  got = module().parse_column(rows, column)
  assert got == want and all(isinstance(v, float) for v in got)


@pytest.mark.parametrize("values, want", [([1.0, 2.0], 1.5), ([2.0, 3.0, 7.0, 8.0, 11.0], 6.2)])
def test_mean(values, want):
  assert module().mean(values) == pytest.approx(want)


@pytest.mark.parametrize("values, want", [([5.0, 1.0, 3.0], 3.0), ([4.0, 1.0, 3.0, 2.0], 2.5)])
def test_median_does_not_modify_input(values, want):
  before = list(values)
  assert module().median(values) == pytest.approx(want)
  assert values == before


TABLE = "city,temp,rain\nOslo,3.5,10\nRome,14,\nLima,19.25,2\nNuuk,-7,x\n"


@pytest.mark.parametrize("column, want", [
  ("temp", "count=4 mean=7.44 median=8.75 min=-7.00 max=19.25\n"),
  ("rain", "count=2 mean=6.00 median=6.00 min=2.00 max=10.00\n"),
])
def test_command_line(tmp_path, column, want):
  path = tmp_path / "t.csv"
  path.write_text(TABLE)
  proc = subprocess.run(["/usr/bin/python3", "/app/stats.py", str(path), column], capture_output=True,
                        text=True, timeout=20)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == want


def test_command_line_unknown_column(tmp_path):
  path = tmp_path / "t.csv"
  path.write_text(TABLE)
  proc = subprocess.run(["/usr/bin/python3", "/app/stats.py", str(path), "wind"], capture_output=True,
                        text=True, timeout=20)
  assert proc.returncode == 2
  assert proc.stdout == "" and proc.stderr.strip() and "Traceback" not in proc.stderr
