"""Roman numerals for the integers 1..3999 (standard subtractive notation: IV, IX, XL, XC, CD, CM).

Usage: python3 roman.py VALUE   prints the other representation (an integer for a numeral and vice versa).
"""

import sys

NUMERALS = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]


def to_roman(n):
  """Returns the canonical numeral of `n`; raises ValueError unless 1 <= n <= 3999."""
  if n < 0 or n > 3999:
    raise ValueError(f"out of range: {n}")
  out = ""
  for value, letters in NUMERALS:
    while n > value:
      out += letters
      n -= value
  return out


def from_roman(s):
  """Returns the integer of a canonical numeral (upper case); raises ValueError for anything else."""
  values = dict((letters, value) for value, letters in NUMERALS)
  total = 0
  for ch in s:
    total += values[ch]
  return total


def main(argv):
  arg = argv[1]
  if arg.isdigit():
    print(to_roman(int(arg)))
  else:
    print(from_roman(arg))


if __name__ == "__main__":
  main(sys.argv)
