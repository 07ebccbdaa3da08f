"""Checks report.json against aggregates recomputed from a pristine copy of sales.csv (15 checks)."""

import csv
import json
from collections import defaultdict
from pathlib import Path

import pytest

CSV = Path(__file__).with_name("sales.csv")  # the verifier's own copy, not the agent's
KEYS = {"orders", "total_units", "total_revenue", "revenue_by_region", "revenue_by_month", "units_by_product",
        "top_product"}
CENT = 0.006


def reference():
  ref = {"orders": 0, "total_units": 0, "total_revenue": 0.0, "revenue_by_region": defaultdict(float),
         "revenue_by_month": defaultdict(float), "units_by_product": defaultdict(int)}
  by_product = defaultdict(float)
  with open(CSV, newline="") as f:
    for row in csv.DictReader(f):
      v = int(row["units"]) * float(row["unit_price"])
      ref["orders"] += 1
      ref["total_units"] += int(row["units"])
      ref["total_revenue"] += v
      ref["revenue_by_region"][row["region"]] += v
      ref["revenue_by_month"][row["date"][:7]] += v
      ref["units_by_product"][row["product"]] += int(row["units"])
      by_product[row["product"]] += v
  ref["top_product"] = max(by_product, key=by_product.get)
  return ref


REF = reference()


def report():
  path = Path("/app/report.json")
  assert path.is_file(), "/app/report.json is missing"
  data = json.loads(path.read_text())
  assert isinstance(data, dict)
  return data


def test_report_is_a_json_object():
  report()


def test_report_has_exactly_the_keys():
  assert set(report()) == KEYS


def test_orders():
  assert report()["orders"] == REF["orders"]


def test_total_units():
  got = report()["total_units"]
  assert isinstance(got, int) and got == REF["total_units"]


def test_total_revenue():
  assert abs(report()["total_revenue"] - REF["total_revenue"]) < CENT


@pytest.mark.parametrize("region", sorted(REF["revenue_by_region"]))
def test_revenue_by_region(region):
  got = report()["revenue_by_region"]
  assert set(got) == set(REF["revenue_by_region"])
  assert abs(got[region] - REF["revenue_by_region"][region]) < CENT


@pytest.mark.parametrize("month", sorted(REF["revenue_by_month"]))
def test_revenue_by_month(month):
  got = report()["revenue_by_month"]
  assert set(got) == set(REF["revenue_by_month"])
  assert abs(got[month] - REF["revenue_by_month"][month]) < CENT


def test_units_by_product():
  assert report()["units_by_product"] == dict(REF["units_by_product"])


def test_top_product():
  assert report()["top_product"] == REF["top_product"]


def test_money_is_rounded_to_cents():
  data = report()
  money = [data["total_revenue"], *data["revenue_by_region"].values(), *data["revenue_by_month"].values()]
  assert all(isinstance(v, (int, float)) and round(v, 2) == v for v in money)
