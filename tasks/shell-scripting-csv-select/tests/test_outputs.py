"""Runs the agent's csvselect.sh on a small table (8 checks)."""

import subprocess

import pytest

SCRIPT = "/app/csvselect.sh"
TABLE = ("name,team,city,score\n"
         "ana,red,New York,10\n"
         "bo,blue,York,7\n"
         "cy,red,York,3\n"
         "di,Red,New York,8\n"
         "ed,blue,New York,redblue\n")


def run(args, stdin=None):
  return subprocess.run([SCRIPT, *args], input=stdin, capture_output=True, text=True, timeout=20)


@pytest.fixture
def table(tmp_path):
  path = tmp_path / "t.csv"
  path.write_text(TABLE)
  return str(path)


def rows(*names):
  lines = TABLE.splitlines()
  return "\n".join([lines[0]] + [l for l in lines[1:] if l.split(",")[0] in names]) + "\n"


@pytest.mark.parametrize("column, value, names", [
  ("team", "red", ("ana", "cy")),
  ("city", "New York", ("ana", "di", "ed")),
  ("city", "York", ("bo", "cy")),
  ("score", "7", ("bo",)),
])
def test_selects_whole_field_matches(table, column, value, names):
  proc = run([column, value, table])
  assert proc.returncode == 0 and proc.stdout == rows(*names)


def test_no_match_prints_header_only(table):
  proc = run(["team", "green", table])
  assert proc.returncode == 0 and proc.stdout == TABLE.splitlines()[0] + "\n"


def test_reads_standard_input():
  proc = run(["team", "blue"], stdin=TABLE)
  assert proc.returncode == 0 and proc.stdout == rows("bo", "ed")


def test_unknown_column_or_missing_file(table, tmp_path):
  for args in (["colour", "red", table], ["team", "red", str(tmp_path / "missing.csv")]):
    proc = run(args)
    assert proc.returncode == 1 and proc.stdout == "" and proc.stderr.strip(), args


def test_bad_usage(table):
  for args in ([], ["team"], ["team", "red", table, "extra"]):
    proc = run(args, stdin="")
    assert proc.returncode == 2 and proc.stderr.strip(), args
