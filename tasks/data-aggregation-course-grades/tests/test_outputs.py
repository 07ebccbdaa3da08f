"""Checks the course summary against figures recomputed from a pristine copy of grades.json (15 checks)."""

import csv
import json
from collections import defaultdict
from pathlib import Path

import pytest

DATA = Path(__file__).with_name("grades.json")  # the verifier's own copy, not the agent's
HEADER = ["course", "students", "mean", "min", "max", "pass_rate"]


def reference():
  by_course = defaultdict(list)
  for rec in json.loads(DATA.read_text()):
    if rec["score"] is not None:
      by_course[rec["course"]].append((rec["score"], rec["student"]))
  return dict(sorted(by_course.items()))


REF = reference()


def rows():
  path = Path("/app/course_summary.csv")
  assert path.is_file(), "/app/course_summary.csv is missing"
  with open(path, newline="") as f:
    return list(csv.reader(f))


def row_of(course):
  found = [r for r in rows()[1:] if r and r[0] == course]
  assert len(found) == 1, f"expected one row for {course}"
  assert len(found[0]) == len(HEADER)
  return dict(zip(HEADER, found[0]))


def test_header():
  assert rows()[0] == HEADER


def test_one_row_per_course_in_order():
  assert [r[0] for r in rows()[1:] if r] == list(REF)


def test_students_column():
  assert {c: row_of(c)["students"] for c in REF} == {c: str(len(v)) for c, v in REF.items()}


@pytest.mark.parametrize("course", list(REF))
def test_mean(course):
  scores = [s for s, _ in REF[course]]
  assert row_of(course)["mean"] == f"{sum(scores) / len(scores):.2f}"


def test_min_and_max_columns():
  for course, recs in REF.items():
    scores = [s for s, _ in recs]
    row = row_of(course)
    assert (row["min"], row["max"]) == (str(min(scores)), str(max(scores))), course


@pytest.mark.parametrize("course", list(REF))
def test_pass_rate(course):
  scores = [s for s, _ in REF[course]]
  assert row_of(course)["pass_rate"] == f"{sum(s >= 50 for s in scores) / len(scores):.2f}"


def test_top_students():
  path = Path("/app/top_students.txt")
  assert path.is_file(), "/app/top_students.txt is missing"
  want = [f"{c} {min(recs, key=lambda r: (-r[0], r[1]))[1]}" for c, recs in REF.items()]
  assert path.read_text().splitlines() == want
