"""Runs the agent's render.sh on templates with known renderings (8 checks)."""

import os
import subprocess

import pytest

SCRIPT = "/app/render.sh"


def render(tmp_path, template, env, args=None):
  path = tmp_path / "t.tpl"
  path.write_text(template)
  base = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG")}
  return subprocess.run([SCRIPT, *(args if args is not None else [str(path)])], capture_output=True,
                        text=True, timeout=20, env={**base, **env})


@pytest.mark.parametrize("template, env, want", [
  ("listen {{PORT}};\n", {"PORT": "8080"}, "listen 8080;\n"),
  ("{{A}}-{{B_2}}-{{A}}\n", {"A": "x", "B_2": "y"}, "x-y-x\n"),
  ("path={{P}}\n", {"P": "/srv/a&b\\c $HOME"}, "path=/srv/a&b\\c $HOME\n"),
  ("{{ X }} {{lower}} {X} {{Y}}\n", {"Y": "{{X}}", "X": "no"}, "{{ X }} {{lower}} {X} {{X}}\n"),
])
def test_renders(tmp_path, template, env, want):
  proc = render(tmp_path, template, env)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == want


def test_empty_value_and_no_final_newline(tmp_path):
  proc = render(tmp_path, "a{{E}}b\n\nend", {"E": ""})
  assert proc.returncode == 0 and proc.stdout == "ab\n\nend"


def test_text_without_placeholders_unchanged(tmp_path):
  text = "  indented\ttabs\n\\n not a newline\n% 100% & more\n"
  proc = render(tmp_path, text, {})
  assert proc.returncode == 0 and proc.stdout == text


def test_missing_variables(tmp_path):
  proc = render(tmp_path, "{{B}} {{A}} {{SET}} {{B}}\n", {"SET": "1"})
  assert proc.returncode == 1 and proc.stdout == ""
  assert [l for l in proc.stderr.splitlines() if l.startswith("missing:")] == ["missing: B", "missing: A"]


def test_bad_usage(tmp_path):
  for args in ([], [str(tmp_path / "nope.tpl")]):
    proc = render(tmp_path, "x", {}, args=args)
    assert proc.returncode == 2, args
