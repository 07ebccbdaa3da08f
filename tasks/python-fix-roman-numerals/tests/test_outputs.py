"""Runs the repaired roman.py against an independent table of numerals (10 checks)."""

import importlib
import subprocess
import sys

import pytest

sys.path.insert(0, "/app")

KNOWN = {1: "I", 3: "III", 4: "IV", 9: "IX", 14: "XIV", 40: "XL", 90: "XC", 400: "CD", 444: "CDXLIV",
         900: "CM", 1994: "MCMXCIV", 2024: "MMXXIV", 3888: "MMMDCCCLXXXVIII", 3999: "MMMCMXCIX"}


def module():
  import roman
  return importlib.reload(roman)


@pytest.mark.parametrize("numbers", [[1, 3, 14, 2024, 3888], [4, 9, 40, 90], [400, 444, 900, 1994, 3999]])
def test_to_roman(numbers):
  m = module()
  assert [m.to_roman(n) for n in numbers] == [KNOWN[n] for n in numbers]


def test_to_roman_rejects_out_of_range():
  m = module()
  for bad in (0, -3, 4000):
    with pytest.raises(ValueError):
      m.to_roman(bad)


@pytest.mark.parametrize("numbers", [[1, 3, 14, 2024, 3888], [4, 9, 40, 90, 444], [400, 900, 1994, 3999]])
def test_from_roman(numbers):
  m = module()
  assert [m.from_roman(KNOWN[n]) for n in numbers] == numbers


def test_from_roman_round_trips_every_value():
  m = module()
  assert all(m.from_roman(m.to_roman(n)) == n for n in range(1, 4000))


def test_from_roman_rejects_non_canonical():
  m = module()
  for bad in ["", "IIII", "IC", "VX", "iv", "ABC", "MMMM"]:
    with pytest.raises(ValueError):
      m.from_roman(bad)


def test_command_line():
  out = [subprocess.run(["/usr/bin/python3", "/app/roman.py", arg], capture_output=True, text=True,
                        timeout=20).stdout for arg in ("1994", "MCMXCIV")]
  assert out == ["MCMXCIV\n", "1994\n"]
