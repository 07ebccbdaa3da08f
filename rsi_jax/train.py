"""Training entry point: ``python -m rsi_jax.train [--config=configs/smoke.yml] [--distributed] [key=value ...]``.

Positional ``key=value`` arguments override the config (dotted keys address sections, ``model_name=``
picks a model file) and win over the phase files. The run walks ``pipeline.phases`` in
``<run.output_dir>/<run.name>/`` and resumes what an earlier attempt left there (``run.resume``). The console
shows one line per phase step; library logging goes to ``<run folder>/train.log``. On the CPU the process gives
itself the virtual devices the config's mesh needs (unless ``XLA_FLAGS=--xla_force_host_platform_device_count=N``
sets the count).

Exit status: 0 done (or preempted by SIGTERM after writing a checkpoint), 1 the run stopped (an invariant,
nothing to train on, an error; the reason is printed), 2 a usage error (an unknown flag: one line), the config
or the pre-flight checks failed (also when found after start-up: another task pool or config than the run's
checkpoints were made with, a checkpoint that fails its digests), 130 stopped by Ctrl-C (SIGINT: like SIGTERM,
the newest state is checkpointed first; a second Ctrl-C stops at once).
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile
import traceback

from absl import flags, logging

from rsi_jax import cli
from rsi_jax.config import dump_config, load_cli_config
from rsi_jax.log import LibraryOutputToFile, setup_logging

FLAGS = cli.flag_values()
_CONFIG = flags.DEFINE_string("config", "configs/smoke.yml", "Run config file (YAML).", flag_values=FLAGS)
DISTRIBUTED_HELP = ("One process of a multi-host run: jax.distributed.initialize() first (a Cloud TPU slice, SLURM "
                    "or Open MPI finds its peers; elsewhere set RSI_COORDINATOR=host:port, RSI_NUM_PROCESSES, "
                    "RSI_PROCESS_ID, which imply this flag).")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, DISTRIBUTED_HELP, flag_values=FLAGS)


def main(argv=None) -> int:
  overrides = cli.parse(FLAGS, argv, "python -m rsi_jax.train", __doc__)
  return run_program(_CONFIG.value, overrides, distributed=_DISTRIBUTED.value)


def run_program(config_path: str, overrides, after=None, distributed: bool = False) -> int:
  """Run the configured phase plan (the training program); ``after(result, console)`` is called when it
  finished. Returns the exit status. ``distributed``: this is one process of a multi-host run
  (:mod:`rsi_jax.pipeline.multihost`; also when ``RSI_COORDINATOR`` is set)."""
  try:
    return _run_program(config_path, overrides, after, distributed)
  except KeyboardInterrupt:  # Ctrl-C before the run could checkpoint (start-up), or a second Ctrl-C
    print(INTERRUPTED, file=sys.stderr, flush=True)
    return 130
  except cli.Terminated:  # SIGTERM before the run's own handler was installed (start-up) or after it (teardown)
    print(TERMINATED, file=sys.stderr, flush=True)
    return 0
  except Exception:
    if cli.ctrl_c_seen():  # a Ctrl-C that library code turned into its own error (e.g. while importing MaxText)
      print(INTERRUPTED, file=sys.stderr, flush=True)
      return 130
    if cli.sigterm_seen():  # the same for a SIGTERM (e.g. while MaxText builds its config)
      print(TERMINATED, file=sys.stderr, flush=True)
      return 0
    raise


INTERRUPTED = ("interrupted (Ctrl-C): stopped before a checkpoint could be written; rerun the same command to resume "
               "from the newest one")
TERMINATED = ("preempted (SIGTERM): stopped before a checkpoint could be written; rerun the same command to resume "
              "from the newest one")


def _run_program(config_path: str, overrides, after, distributed: bool) -> int:
  cfg = load_cli_config(config_path, overrides)
  distributed = distributed or bool(os.environ.get("RSI_COORDINATOR"))
  cli.provide_cpu_devices(cfg.mesh, distributed)  # before JAX starts its backends
  # heavy imports only after the config is known to be valid
  from rsi_jax.pipeline import multihost
  if distributed:
    logging.set_verbosity(logging.WARNING)  # the log file is not open yet: no INFO lines on the console
    multihost.initialize()  # before anything asks JAX for its devices
  from rsi_jax.pipeline.console import Console
  from rsi_jax.pipeline.driver import Driver
  from rsi_jax.pipeline.plan import PreflightError, check_output_location, preflight
  from rsi_jax.pipeline.preemption import Preempted
  from rsi_jax.pipeline.run_folder import run_dir_of
  from rsi_jax.env.pool import AllEndpointsDown
  from rsi_jax.models.checkpoint import CheckpointError
  from rsi_jax.pipeline.errors import InvariantError, NoTrainableSamples
  run_dir = run_dir_of(cfg)
  # the other processes log to train.<process>.log and print only failures (asked only when distributed:
  # asking starts JAX's backends, whose messages would reach the console before the log file is open)
  primary = not distributed or multihost.is_primary()
  suffix = "" if primary else f".{multihost.process_index()}"
  if "://" in run_dir:  # an object-store run folder: the log file stays on this machine
    log_path = os.path.join(tempfile.gettempdir(), f"rsi_jax-{cfg.run.name}{suffix}.log")
  else:
    try:  # the log file goes into the run folder: it must be creatable before anything else
      check_output_location(run_dir, "run.output_dir")
    except PreflightError as e:
      print(f"cannot start: {e}", file=sys.stderr, flush=True)
      return 2
    os.makedirs(run_dir, exist_ok=True)
    log_path = os.path.join(run_dir, f"train{suffix}.log")
  with LibraryOutputToFile(log_path) as out:
    setup_logging(cfg.run.log_level)
    logging.info("config %s with %d override(s)\n%s", config_path, len(overrides), dump_config(cfg))
    try:
      plan = preflight(cfg, overrides)
    except PreflightError as e:
      print(f"cannot start: {e}", file=out.console_err, flush=True)
      return 2
    console = Console(out.console_out if primary else _Quiet(out.console_err), out.console_err,
                      progress=cfg.run.progress and primary)
    console.line(f"log: {log_path}")
    try:
      r = Driver(cfg, overrides, console=console, plan=plan).run()
    except Preempted as e:
      console.line(e.message())
      return 130 if e.signal_name == "Ctrl-C" else 0
    except PreflightError as e:  # found once the run folder or the processes could be read
      logging.error("cannot start: %s", e)
      print(f"cannot start: {e}", file=out.console_err, flush=True)
      return 2
    except CheckpointError as e:  # a checkpoint the run starts from (actor_from, a finished phase) is refused
      logging.error("cannot load checkpoint: %s", e)
      print(f"cannot load checkpoint: {e}", file=out.console_err, flush=True)
      return 2
    except (InvariantError, NoTrainableSamples, AllEndpointsDown) as e:
      logging.error("run stopped: %s", e)
      console.line(f"run stopped: {type(e).__name__}: {e}")
      return 1
    except Exception as e:  # noqa: BLE001 - the console gets the reason, the log the traceback
      logging.error("run failed:\n%s", traceback.format_exc())
      if cli.ctrl_c_seen() or cli.sigterm_seen():  # a stop signal that library code turned into its own error:
        raise                                        # run_program reports it
      full = _disk_full(e)
      if full is not None:
        where = full or run_dir
        console.line(f"run stopped: no space left on device while writing {where}: free space on its file system, "
                     f"then rerun the same command to resume from the newest complete checkpoint (traceback in "
                     f"{log_path})")
        return 1
      console.line(f"run failed: {type(e).__name__}: {e} (traceback in {log_path})")
      return 1
    console.line(
        f"done in {r['seconds']:.0f}s{' (resumed)' if r['resumed'] else ''}: {r['episodes']} episodes "
        f"({r['aborted']} stopped by oversampling), {r['infra_failures']} infrastructure failures (masked)"
        + (f", {r['retried']} run(s) lost to a dead Docker endpoint and run again elsewhere" if r["retried"] else "")
        + "\n"
        f"  final weights  {r['final']}\n"
        f"  checkpoints    {r['checkpoints']}/<phase>/<step>/ (Orbax: actor, critic, optimizer states, meta)\n"
        f"  lineage        {r['lineage']}\n"
        f"  metrics        {r['metrics']}\n"
        f"  tensorboard    {r['tensorboard']}  (tensorboard --logdir {r['tensorboard']})\n"
        f"  plots          {r['plots']}/ ({len(r['plot_files'])} PNG)\n"
        + (f"  eval report    {r['eval_report']}/report.md (+ PNG plots)\n" if r.get("eval_report") else "")
        + f"  log            {log_path}")
    if after is not None:
      after(r, console)
  return 0


def _disk_full(e: BaseException) -> str | None:
  """The path (or "" when unknown) of a write that failed because the file system is full, if that is what
  ``e`` or an exception behind it is (Orbax's background writers and tensorstore wrap the OSError)."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
      return str(e.filename or "")
    if "No space left on device" in str(e):
      return ""
    e = e.__cause__ or e.__context__
  return None


class _Quiet:
  """The console of a multi-host run's other processes: only why the run stopped or failed."""

  def __init__(self, err):
    self.err = err
    self._on = False

  def write(self, text: str):
    if text.startswith(("run stopped", "run failed")):
      self._on = True
    if self._on:
      self.err.write(text)
    if text.endswith("\n"):
      self._on = False

  def flush(self):
    self.err.flush()


if __name__ == "__main__":
  cli.keep_stop_signals()
  sys.exit(main())
