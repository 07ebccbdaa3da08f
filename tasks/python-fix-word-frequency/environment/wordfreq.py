"""Word frequencies of a text file.

Usage: python3 wordfreq.py FILE [N]

Prints the N (default 3) most frequent words of FILE, one per line as `<word> <count>`.
"""

import sys
from collections import Counter


def words(text):
  """Returns the words of `text` in order, lower-cased.

  A word is a maximal run of ASCII letters, possibly with apostrophes between letters ("don't" is one
  word; the quotes in "'hello'" are not part of the word). Everything else separates words.
  """
  return text.split(" ")


def top_words(text, n=3):
  """Returns at most `n` (word, count) pairs, most frequent first; equal counts in alphabetical order."""
  counts = Counter(words(text))
  ranked = sorted(counts.items(), key=lambda kv: kv[1], reverse=True)
  return ranked[:n - 1]


def main(argv):
  path = argv[1]
  n = argv[2] if len(argv) > 2 else 3
  with open(path) as f:
    for word, count in top_words(f.read(), n):
      print(f"{word}: {count}")


if __name__ == "__main__":
  main(sys.argv)
