"""Runs the agent's retry.sh against commands with known failure patterns (8 checks)."""

import subprocess
import time
from pathlib import Path

SCRIPT = "/app/retry.sh"


def counter_command(tmp_path, fail_times, status=5):
  """A command that fails `fail_times` times with `status`, then succeeds; counts its runs in a file."""
  count = tmp_path / "count"
  script = tmp_path / "cmd.sh"
  script.write_text("#!/bin/bash\n"
                    f'n=$(cat {count} 2>/dev/null || echo 0); echo $((n + 1)) > {count}\n'
                    f'if [ "$n" -lt {fail_times} ]; then echo "err $n" >&2; exit {status}; fi\n'
                    'echo "out:$*"\n')
  script.chmod(0o755)
  return str(script), count


def run(*args):
  return subprocess.run([SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=30)


def runs(count):
  return int(count.read_text()) if count.exists() else 0


def test_success_on_first_attempt(tmp_path):
  cmd, count = counter_command(tmp_path, 0)
  proc = run(3, 0, cmd)
  assert proc.returncode == 0 and runs(count) == 1
  assert proc.stdout == "out:\n"


def test_retries_until_success(tmp_path):
  cmd, count = counter_command(tmp_path, 2)
  proc = run(5, 0, cmd)
  assert proc.returncode == 0 and runs(count) == 3


def test_gives_up_with_last_status(tmp_path):
  cmd, count = counter_command(tmp_path, 10, status=7)
  proc = run(4, 0, cmd)
  assert proc.returncode == 7 and runs(count) == 4


def test_attempt_lines_on_stderr(tmp_path):
  cmd, _ = counter_command(tmp_path, 1)
  proc = run(3, 0, cmd)
  lines = [l for l in proc.stderr.splitlines() if l.startswith("attempt ")]
  assert lines == ["attempt 1/3", "attempt 2/3"]
  assert "err 0" in proc.stderr and "attempt" not in proc.stdout


def test_arguments_passed_unchanged(tmp_path):
  cmd, _ = counter_command(tmp_path, 0)
  proc = run(2, 0, cmd, "a b", "", "*", "$HOME")
  assert proc.returncode == 0 and proc.stdout == "out:a b  * $HOME\n"


def test_delay_between_attempts_only(tmp_path):
  # Lower bounds and a wide upper bound only, so a loaded machine cannot make this flaky.
  cmd, count = counter_command(tmp_path, 10)
  start = time.monotonic()
  proc = run(2, 0.5, cmd)
  assert proc.returncode == 5 and runs(count) == 2
  assert time.monotonic() - start >= 0.45, "no delay between attempts"
  start = time.monotonic()
  proc = run(1, 3, cmd)
  assert proc.returncode == 5 and runs(count) == 3
  assert time.monotonic() - start < 2.0, "slept after the last attempt"


def test_rejects_bad_usage(tmp_path):
  cmd, count = counter_command(tmp_path, 0)
  for args in ([3, 0], [0, 0, cmd], ["x", 0, cmd], [2, "-1", cmd], [2, "soon", cmd]):
    proc = run(*args)
    assert proc.returncode == 64 and proc.stderr.strip(), args
  assert runs(count) == 0, "the command must not run on bad usage"


def test_command_not_found_status(tmp_path):
  proc = run(2, 0, str(tmp_path / "no-such-command"))
  assert proc.returncode == 127
  assert [l for l in proc.stderr.splitlines() if l.startswith("attempt ")] == ["attempt 1/2", "attempt 2/2"]
