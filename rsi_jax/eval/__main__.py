"""Evaluation entry point.

    python -m rsi_jax.eval --config=configs/smoke.yml [--tasks_dir=DIR] [--harness=json|xml|oracle]
        [--repeats=3] [--checkpoint=runs/smoke/checkpoints/rpr2] [--tasks=a,b] [--output=DIR] [--strict]
        [key=value ...]

Runs every task of a suite (``--tasks_dir``: any folder of Harbor/TB2 or TB1 task folders, loaded unchanged;
default ``eval.tasks_dir``, else ``env.tasks_dir``) R times under the harness — the actor through the sampler
at the evaluation sampling (``eval.temperature`` 0.6, ``eval.top_p`` 0.95, ``eval.max_new_tokens``), or the
reference solutions with ``--harness=oracle`` — and prints Mean@R, pass@R (over scored attempts, and with
infrastructure failures as failures), process reward, strict completions, per-difficulty and per-stratum
results. A task folder that cannot run (malformed, a link that leaves it, a base image only a registry has, no
reference solution under the oracle, ...) is refused and listed with its reason, and the rest is evaluated;
``--strict`` stops at the first such folder instead. A task named twice in ``--tasks`` runs once (a note says
so). ``--output`` writes ``summary.json`` (``refused``: [{task, reason}]), ``attempts.jsonl`` and ``eval.log``
(library logging, kept in ``$TMPDIR/rsi_jax-eval-<run.name>-*.log`` without ``--output`` or when the evaluation
fails): the console keeps the results and this package's warnings. On the CPU the process gives itself the virtual devices the config's
mesh needs (unless ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` sets the count).

Exit status 0 when it ran (whatever the score), 1 when it failed (the reason on the console, the traceback in
the log), 2 for a usage or config error (an unknown flag, ``--output`` naming a file, ...; one line, before any
work), a missing suite folder, a refused folder under ``--strict``, or a checkpoint that does not restore as
written (one line).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import traceback

from absl import flags

from rsi_jax import cli
from rsi_jax.config import load_cli_config
from rsi_jax.log import LibraryOutputToFile, setup_logging

PROG = "python -m rsi_jax.eval"
FLAGS = cli.flag_values()
_CONFIG = flags.DEFINE_string("config", "configs/smoke.yml", "Run config file (YAML).", flag_values=FLAGS)
_TASKS_DIR = flags.DEFINE_string("tasks_dir", "", "Suite folder (default eval.tasks_dir, else env.tasks_dir).",
                                 flag_values=FLAGS)
_HARNESS = flags.DEFINE_enum("harness", None, ["json", "xml", "oracle"], "Harness (default eval.harness).",
                             flag_values=FLAGS)
_REPEATS = flags.DEFINE_integer("repeats", None, "Attempts per task, R (default eval.repeats).", lower_bound=1,
                                flag_values=FLAGS)
_CHECKPOINT = flags.DEFINE_string("checkpoint", "", "Orbax checkpoint (step or phase folder) of the actor.",
                                  flag_values=FLAGS)
_TASKS = flags.DEFINE_list("tasks", [], "Task folder names (default: the suite, eval.max_tasks of it).",
                           flag_values=FLAGS)
_OUTPUT = flags.DEFINE_string("output", "", "Write summary.json, attempts.jsonl and eval.log into this folder.",
                              flag_values=FLAGS)
_STRICT = flags.DEFINE_bool("strict", False, "Stop at the first task folder that cannot run (default: refuse it, "
                            "list it with its reason, evaluate the rest).", flag_values=FLAGS)


def main(argv=None) -> int:
  overrides = cli.parse(FLAGS, argv, PROG, __doc__)
  try:
    cli.check_output_folder(_OUTPUT.value, "output")
  except cli.UsageError as e:
    cli.fail(PROG, str(e))
  cfg = load_cli_config(_CONFIG.value, overrides)
  cli.provide_cpu_devices(cfg.mesh)  # before JAX starts its backends
  fd, log_path = tempfile.mkstemp(prefix=f"rsi_jax-eval-{cfg.run.name}-", suffix=".log")
  os.close(fd)
  with LibraryOutputToFile(log_path, own_warnings=True) as out:
    setup_logging(cfg.run.log_level)
    rc = _evaluate(cfg, out, log_path)
  if rc == 2:  # its one line says it all
    os.remove(log_path)
  elif rc == 0 and _OUTPUT.value:  # the log goes with the results
    from etils import epath
    kept = epath.Path(_OUTPUT.value) / "eval.log"
    kept.write_text(epath.Path(log_path).read_text())
    os.remove(log_path)
    log_path = str(kept)
  if rc == 0:
    print(f"log: {log_path}", flush=True)
  return rc


def _evaluate(cfg, out, log_path: str) -> int:
  from rsi_jax.env.tasks import TaskError
  from rsi_jax.eval.run import evaluate_config
  from rsi_jax.models.checkpoint import CheckpointError
  try:
    report = evaluate_config(cfg, harness=_HARNESS.value or cfg.eval.harness,
                             repeats=_REPEATS.value or cfg.eval.repeats, checkpoint=_CHECKPOINT.value,
                             task_names=_TASKS.value, tasks_dir=_TASKS_DIR.value, strict=_STRICT.value)
  except CheckpointError as e:  # corrupted, unreadable or of another model size
    print(f"cannot load checkpoint: {e}", file=out.console_err)
    return 2
  except (TaskError, FileNotFoundError) as e:
    print(f"cannot evaluate: {e}", file=out.console_err)
    return 2
  except Exception as e:  # noqa: BLE001 - the console gets the reason, the log the traceback
    logging.getLogger(__name__).error("evaluation failed:\n%s", traceback.format_exc())
    print(f"evaluation failed: {type(e).__name__}: {e} (traceback in {log_path})", file=out.console_err)
    return 1
  print(report.render(), file=out.console_out)
  if _OUTPUT.value:
    print(f"results: {report.write(_OUTPUT.value)}", file=out.console_out)
  return 0


if __name__ == "__main__":
  cli.keep_stop_signals()
  sys.exit(main())
