"""rsi_jax.log: library output goes to the run's log file, the terminal keeps the run's own lines."""

import signal
import subprocess
import sys
import textwrap

import pytest

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


# A Ctrl-C or a SIGTERM that arrives while a garbage-collection callback runs (JAX registers one; while a program
# imports and builds its models it runs thousands of times) is raised inside the callback, where Python can only
# report it ("Exception ignored in: <function _xla_gc_callback>"): the stop was lost and the start-up went on (a
# loaded machine lost a preemption notice so: the run trained on to its end).
_STOP_IN_GC = textwrap.dedent("""
  import gc, sys, time
  from rsi_jax import cli
  if sys.argv[1] == "keep":
    cli.keep_stop_signals()
  elif sys.argv[1] == "raise":  # a SIGTERM handler that raises, as the environment layer installs for its users
    from rsi_jax.env.reaper import install_signal_handlers
    install_signal_handlers()
  armed = [True]

  def callback(phase, info):
    if phase == "start" and armed[0]:
      armed[0] = False
      print("in callback", flush=True)
      time.sleep(10)  # the signal arrives here

  gc.callbacks.append(callback)
  try:
    gc.collect()
    for _ in range(30):
      time.sleep(0.1)  # the rest of the start-up
    print("finished", flush=True)
  except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
  except SystemExit:
    print("terminated", flush=True)
    sys.exit(143)
""")


@pytest.mark.parametrize("sig,mode", [("SIGINT", "keep"), ("SIGINT", "default"), ("SIGTERM", "keep"),
                                      ("SIGTERM", "raise")])
def test_a_stop_signal_that_lands_in_a_gc_callback_is_not_lost(sig, mode):
  p = subprocess.Popen([sys.executable, "-c", _STOP_IN_GC, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
  assert p.stdout.readline().strip() == "in callback"
  p.send_signal(getattr(signal, sig))
  out, err = p.communicate(timeout=60)
  if mode == "keep":  # the entry points' setting: delivered again, the program stops as for any Ctrl-C / SIGTERM
    assert (p.returncode, out.strip()) == ((130, "interrupted") if sig == "SIGINT" else (143, "terminated")), \
        (out, err)
    assert "Exception ignored" not in err, err
  else:  # what the setting exists for: a handler's exception in the callback is only reported
    assert (p.returncode, out.strip()) == (0, "finished"), (out, err)
    assert ("KeyboardInterrupt" if sig == "SIGINT" else "SystemExit") in err
