"""Checks the engineering email list and department counts against a pristine copy of the CSV (6 checks)."""

import csv
from collections import Counter
from pathlib import Path

CSV = Path(__file__).with_name("contacts.csv")  # the verifier's own copy, not the agent's


def active_rows():
  with open(CSV, newline="") as f:
    return [r for r in csv.DictReader(f) if r["active"] == "yes"]


def want_emails():
  return sorted({r["email"].strip().lower() for r in active_rows()
                 if r["department"].strip().lower() == "engineering"})


def lines(path):
  p = Path(path)
  assert p.is_file(), f"{path} is missing"
  return p.read_text().splitlines()


def test_emails_are_normalised():
  got = lines("/app/engineering_emails.txt")
  assert got, "no emails written"
  assert all(e == e.strip().lower() and "@" in e for e in got)


def test_emails_have_no_duplicates():
  got = lines("/app/engineering_emails.txt")
  assert got and len(got) == len(set(got))


def test_emails_are_exactly_the_active_engineers():
  assert set(lines("/app/engineering_emails.txt")) == set(want_emails())


def test_emails_are_sorted():
  got = lines("/app/engineering_emails.txt")
  assert got == sorted(set(got)) and got == want_emails()


def test_department_counts():
  want = Counter(r["department"].strip().lower() for r in active_rows())
  got = {}
  for line in lines("/app/department_counts.txt"):
    name, count = line.rsplit(",", 1)
    got[name] = int(count)
  assert got == dict(want)


def test_department_counts_format_and_order():
  want = Counter(r["department"].strip().lower() for r in active_rows())
  assert lines("/app/department_counts.txt") == [f"{d},{n}" for d, n in sorted(want.items())]
