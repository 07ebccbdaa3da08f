"""Checks the stock report, category totals and unknown SKUs against a pristine copy of the inputs
(15 checks)."""

import csv
from collections import defaultdict
from pathlib import Path

import pytest

HERE = Path(__file__).parent  # the verifier's own copies, not the agent's


def read(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


PRODUCTS = {p["sku"]: p for p in read(HERE / "products.csv")}
MOVES = read(HERE / "stock_moves.csv")
CLOSING = {sku: int(p["opening"]) + sum(int(m["qty"]) for m in MOVES if m["sku"] == sku)
           for sku, p in PRODUCTS.items()}
UNKNOWN = sorted({m["sku"] for m in MOVES} - set(PRODUCTS))


def report():
  path = Path("/app/stock_report.csv")
  assert path.is_file(), "/app/stock_report.csv is missing"
  with open(path, newline="") as f:
    return list(csv.reader(f))


def report_rows():
  rows = report()
  return {r[0]: dict(zip(["sku", "name", "category", "closing", "reorder"], r)) for r in rows[1:] if r}


def test_report_header():
  assert report()[0] == ["sku", "name", "category", "closing", "reorder"]


def test_report_rows_in_sku_order():
  assert [r[0] for r in report()[1:] if r] == sorted(PRODUCTS)


def test_report_has_no_unknown_skus():
  assert not set(report_rows()) & set(UNKNOWN)


@pytest.mark.parametrize("sku", sorted(PRODUCTS))
def test_closing_stock(sku):
  assert report_rows()[sku]["closing"] == str(CLOSING[sku])


def test_reorder_flags():
  got = {sku: row["reorder"] for sku, row in report_rows().items()}
  want = {sku: "yes" if CLOSING[sku] <= int(p["reorder_level"]) else "no" for sku, p in PRODUCTS.items()}
  assert got == want


def test_names_and_categories_carried_over():
  got = {sku: (row["name"], row["category"]) for sku, row in report_rows().items()}
  assert got == {sku: (p["name"], p["category"]) for sku, p in PRODUCTS.items()}


def test_category_totals():
  path = Path("/app/category_totals.csv")
  assert path.is_file(), "/app/category_totals.csv is missing"
  totals = defaultdict(int)
  for sku, p in PRODUCTS.items():
    totals[p["category"]] += CLOSING[sku]
  want = ["category,closing"] + [f"{c},{n}" for c, n in sorted(totals.items())]
  assert path.read_text().splitlines() == want


def test_unknown_skus():
  path = Path("/app/unknown_skus.txt")
  assert path.is_file(), "/app/unknown_skus.txt is missing"
  assert path.read_text().splitlines() == UNKNOWN
