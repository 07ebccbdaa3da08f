"""Checks host_stats.json against statistics recomputed from a pristine copy of the samples (15 checks)."""

import json
from pathlib import Path

import pytest

DATA = Path(__file__).with_name("metrics.jsonl")  # the verifier's own copy, not the agent's
KEYS = {"samples", "cpu_avg", "cpu_max", "mem_max_mb", "down"}


def reference():
  by_host = {}
  for line in DATA.read_text().splitlines():
    try:
      rec = json.loads(line)
    except ValueError:
      continue
    if isinstance(rec, dict):
      by_host.setdefault(rec["host"], []).append(rec)
  return by_host


REF = reference()


def stats_of(host):
  path = Path("/app/host_stats.json")
  assert path.is_file(), "/app/host_stats.json is missing"
  data = json.loads(path.read_text())
  assert set(data) == set(REF), "wrong set of hosts"
  assert set(data[host]) == KEYS, f"{host}: wrong keys"
  return data[host]


@pytest.mark.parametrize("host", sorted(REF))
def test_samples(host):
  assert stats_of(host)["samples"] == len(REF[host])


@pytest.mark.parametrize("host", sorted(REF))
def test_cpu(host):
  cpus = [r["cpu"] for r in REF[host] if r["cpu"] is not None]
  got = stats_of(host)
  assert got["cpu_avg"] == pytest.approx(round(sum(cpus) / len(cpus), 3), abs=1e-9)
  assert got["cpu_max"] == pytest.approx(max(cpus), abs=1e-9)


@pytest.mark.parametrize("host", sorted(REF))
def test_memory_and_down(host):
  got = stats_of(host)
  assert got["mem_max_mb"] == max(r["mem_mb"] for r in REF[host])
  assert got["down"] == sum(r["status"] == "down" for r in REF[host])
