"""Runs the repaired wordfreq.py: words(), top_words() and the command line (10 checks)."""

import importlib
import subprocess
import sys

import pytest

sys.path.insert(0, "/app")


def module():
  import wordfreq
  return importlib.reload(wordfreq)


@pytest.mark.parametrize("text, want", [
  ("The cat and the hat", ["the", "cat", "and", "the", "hat"]),
  ("Hello, world! Hello again.\nNew line", ["hello", "world", "hello", "again", "new", "line"]),
  ("don't stop 'quoted' rock'n'roll", ["don't", "stop", "quoted", "rock'n'roll"]),
  ("tabs\tand  double  spaces, 42 numbers3x", ["tabs", "and", "double", "spaces", "numbers", "x"]),
])
def test_words(text, want):
  assert module().words(text) == want


@pytest.mark.parametrize("text, n, want", [
  ("b a c b a b", 3, [("b", 3), ("a", 2), ("c", 1)]),
  ("pear apple fig apple pear kiwi", 2, [("apple", 2), ("pear", 2)]),
  ("One one ONE two", 5, [("one", 3), ("two", 1)]),
  ("x y z", 1, [("x", 1)]),
])
def test_top_words(text, n, want):
  assert module().top_words(text, n) == want


TEXT = "It was the best of times, it was the worst of times.\nIt was the age of wisdom!\n"


@pytest.mark.parametrize("extra, want", [
  ([], "it 3\nof 3\nthe 3\n"),
  (["5"], "it 3\nof 3\nthe 3\nwas 3\ntimes 2\n"),
])
def test_command_line(tmp_path, extra, want):
  path = tmp_path / "input.txt"
  path.write_text(TEXT)
  proc = subprocess.run(["/usr/bin/python3", "/app/wordfreq.py", str(path), *extra],
                        capture_output=True, text=True, timeout=20)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == want
