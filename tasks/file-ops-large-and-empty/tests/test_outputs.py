"""Checks the large-file list and the removal of empty files (3 checks)."""

from pathlib import Path

DATA = Path("/app/data")
SIZES = {  # non-empty files and their sizes in bytes
  "archive.bin": 20000, "logs/big.log": 10241, "logs/edge.log": 10240, "small.txt": 100,
  "x/y/huge.dat": 50000, ".hidden_big": 12000, "name with space.dat": 15000, "cache/part-0001": 9000,
}
EMPTY = ["x/empty1", "x/y/empty2.txt", "cache/.lock", "logs/rotated.log"]
DIRS = ["logs", "x", "x/y", "cache"]


def large_lines():
  path = Path("/app/large_files.txt")
  assert path.is_file(), "/app/large_files.txt is missing"
  return path.read_text().splitlines()


def test_large_file_list_names_the_right_files():
  want = {p for p, n in SIZES.items() if n > 10240}
  assert set(line.removeprefix("./") for line in large_lines()) == want


def test_large_file_list_is_relative_and_sorted():
  lines = large_lines()
  assert lines, "the list is empty"
  assert all(line and not line.startswith(("./", "/")) for line in lines), "paths must be plain relative"
  assert lines == sorted(lines, key=str.encode), "lines are not in byte order"


def test_empty_files_deleted_and_the_rest_kept():
  for rel in EMPTY:
    assert not (DATA / rel).exists(), f"{rel} should have been deleted"
  for rel, size in SIZES.items():
    path = DATA / rel
    assert path.is_file(), f"{rel} must be kept"
    assert path.stat().st_size == size, f"{rel} was modified"
  for rel in DIRS:
    assert (DATA / rel).is_dir(), f"directory {rel} must be kept"
