"""Checks the access-log reports against counts recomputed from a pristine copy of the log (6 checks)."""

import re
from collections import Counter
from pathlib import Path

LOG = Path(__file__).with_name("access.log")  # the verifier's own copy, not the agent's
LINE = re.compile(r'^(\S+) \S+ \S+ \[[^]]*\] "([^"]*)" (\d{3}) ')


def reference():
  ips, statuses, missing = Counter(), Counter(), set()
  for line in LOG.read_text().splitlines():
    ip, request, status = LINE.match(line).groups()
    ips[ip] += 1
    statuses[status] += 1
    if status == "404":
      missing.add(request.split()[1].split("?")[0])
  return ips, statuses, missing


def lines(path):
  p = Path(path)
  assert p.is_file(), f"{path} is missing"
  return p.read_text().splitlines()


def test_top_ips_format():
  got = lines("/app/top_ips.txt")
  assert len(got) == 5
  assert all(re.fullmatch(r"[0-9]+ [0-9.]+", line) for line in got)


def test_top_ips_ranking():
  ips, _, _ = reference()
  want = [f"{n} {ip}" for ip, n in sorted(ips.items(), key=lambda kv: (-kv[1], kv[0]))[:5]]
  assert lines("/app/top_ips.txt") == want


def test_status_counts():
  _, statuses, _ = reference()
  got = dict(line.split(" ") for line in lines("/app/status_counts.txt"))
  assert {k: int(v) for k, v in got.items()} == dict(statuses)


def test_status_counts_order():
  _, statuses, _ = reference()
  assert lines("/app/status_counts.txt") == [f"{s} {n}" for s, n in sorted(statuses.items())]


def test_not_found_paths():
  _, _, missing = reference()
  assert set(lines("/app/not_found.txt")) == missing


def test_not_found_sorted_unique():
  _, _, missing = reference()
  assert lines("/app/not_found.txt") == sorted(missing)
