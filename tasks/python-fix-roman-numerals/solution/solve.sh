#!/bin/bash
set -euo pipefail
cat > /app/roman.py <<'PY'
"""Roman numerals for the integers 1..3999 (standard subtractive notation: IV, IX, XL, XC, CD, CM).

Usage: python3 roman.py VALUE   prints the other representation (an integer for a numeral and vice versa).
"""

import sys

NUMERALS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"),
            (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


def to_roman(n):
  """Returns the canonical numeral of `n`; raises ValueError unless 1 <= n <= 3999."""
  if not isinstance(n, int) or n < 1 or n > 3999:
    raise ValueError(f"out of range: {n}")
  out = ""
  for value, letters in NUMERALS:
    while n >= value:
      out += letters
      n -= value
  return out


def from_roman(s):
  """Returns the integer of a canonical numeral (upper case); raises ValueError for anything else."""
  values = {"M": 1000, "D": 500, "C": 100, "L": 50, "X": 10, "V": 5, "I": 1}
  if not isinstance(s, str) or not s or any(ch not in values for ch in s):
    raise ValueError(f"not a numeral: {s!r}")
  total = 0
  for i, ch in enumerate(s):
    v = values[ch]
    total += -v if i + 1 < len(s) and values[s[i + 1]] > v else v
  if not 1 <= total <= 3999 or to_roman(total) != s:
    raise ValueError(f"not a canonical numeral: {s!r}")
  return total


def main(argv):
  arg = argv[1]
  if arg.isdigit():
    print(to_roman(int(arg)))
  else:
    print(from_roman(arg))


if __name__ == "__main__":
  main(sys.argv)
PY
