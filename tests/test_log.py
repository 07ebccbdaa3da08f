"""rsi_jax.log: library output goes to the run's log file, the terminal keeps the run's own lines."""

import subprocess
import sys
import textwrap

# An abandoned coroutine whose ``except BaseException`` turns the GeneratorExit of its closing into another
# error (what Orbax's ``_read_array_index_and_device_put`` does when a failed restore leaves its reads behind):
# Python reports it as "Exception ignored in: <coroutine ...>" with a traceback when it is collected.
_PROGRAM = textwrap.dedent("""
  import gc, sys, types
  from rsi_jax.log import LibraryOutputToFile

  @types.coroutine
  def pending():
    yield "a read in flight"

  async def read(box):
    try:
      await pending()
    except BaseException as e:
      raise Exception("Encountered error while reading array index") from e

  def abandon():
    box = []
    coro = read(box)
    coro.send(None)  # suspended in its read
    box.append(coro)  # a cycle: only the collector frees it

  with LibraryOutputToFile(sys.argv[1]) as out:
    print("own line", file=out.console_err, flush=True)
    abandon()
  abandon()  # abandoned after the file was let go too, collected at shutdown
  gc.collect()
  print("exit", file=sys.stderr, flush=True)
""")


def test_late_library_reports_go_to_the_log_not_the_terminal(tmp_path):
  log = tmp_path / "train.log"
  p = subprocess.run([sys.executable, "-c", _PROGRAM, str(log)], capture_output=True, text=True, timeout=120)
  assert p.returncode == 0, p.stderr
  assert p.stderr.splitlines() == ["own line", "exit"], p.stderr  # no "Exception ignored" / traceback
  text = log.read_text()
  assert text.count("Exception ignored") == 2, text
  assert text.count("Encountered error while reading array index") == 2, text
