"""Runs the agent's sync.sh on freshly made directory trees (8 checks)."""

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = "/app/sync.sh"
OLD = 1_000_000_000  # a fixed old mtime, to see whether a file was rewritten


def make(root: Path, files: dict[str, str]):
  for rel, text in files.items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (OLD, OLD))


def tree(root: Path):
  return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def dirs(tmp_path):
  src, dst = tmp_path / "src", tmp_path / "dst"
  make(src, {"same.txt": "same\n", "changed.txt": "new\n", "new dir/deep/file one.txt": "1\n",
             ".hidden": "h\n", "B.txt": "b\n"})
  make(dst, {"same.txt": "same\n", "changed.txt": "old\n", "extra.txt": "keep\n"})
  return src, dst


def run(*args):
  return subprocess.run([SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=20)


WANT_LINES = ["copied .hidden", "copied B.txt", "copied changed.txt", "copied new dir/deep/file one.txt"]


def test_copies_missing_and_changed_files(dirs):
  src, dst = dirs
  assert run(src, dst).returncode == 0
  assert tree(dst) == {**tree(src), "extra.txt": "keep\n"}


def test_reports_sorted_copied_lines(dirs):
  src, dst = dirs
  proc = run(src, dst)
  assert proc.stdout.splitlines() == WANT_LINES


def test_identical_files_untouched(dirs):
  src, dst = dirs
  run(src, dst)
  assert (dst / "same.txt").stat().st_mtime == OLD


def test_second_run_copies_nothing(dirs):
  src, dst = dirs
  run(src, dst)
  proc = run(src, dst)
  assert proc.returncode == 0 and proc.stdout == ""


def test_dry_run_reports_without_changing(dirs):
  src, dst = dirs
  before = tree(dst)
  proc = run("--dry-run", src, dst)
  assert proc.returncode == 0 and proc.stdout.splitlines() == WANT_LINES
  assert tree(dst) == before


def test_only_in_destination_is_kept(dirs):
  src, dst = dirs
  (src / "extra.txt").unlink(missing_ok=True)
  run(src, dst)
  assert (dst / "extra.txt").read_text() == "keep\n" and (dst / "changed.txt").read_text() == "new\n"


def test_missing_directories_rejected(dirs, tmp_path):
  src, dst = dirs
  before = tree(dst)
  for args in ([src, tmp_path / "nope"], [tmp_path / "nope", dst]):
    proc = run(*args)
    assert proc.returncode == 2 and proc.stderr.strip(), args
  assert tree(dst) == before


def test_bad_usage_rejected(dirs):
  src, dst = dirs
  before = tree(dst)
  for args in ([], [src], [src, dst, dst], ["--dry-run", src]):
    proc = run(*args)
    assert proc.returncode == 2, args
  assert tree(dst) == before
