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
so). ``--output`` writes ``summary.json`` (``refused``: [{task, reason}]) and ``attempts.jsonl``. Exit status 0
when it ran (whatever the score), 2 for a bad config or argument, a missing suite folder, a refused folder under
``--strict``, or a checkpoint that does not restore as written (one line).
"""

from __future__ import annotations

import sys

from absl import app, flags

from rsi_jax.config import load_cli_config
from rsi_jax.log import setup_logging

_CONFIG = flags.DEFINE_string("config", "configs/smoke.yml", "Run config file (YAML).")
_TASKS_DIR = flags.DEFINE_string("tasks_dir", "", "Suite folder (default eval.tasks_dir, else env.tasks_dir).")
_HARNESS = flags.DEFINE_enum("harness", None, ["json", "xml", "oracle"], "Harness (default eval.harness).")
_REPEATS = flags.DEFINE_integer("repeats", None, "Attempts per task, R (default eval.repeats).")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "", "Orbax checkpoint (step or phase folder) of the actor.")
_TASKS = flags.DEFINE_list("tasks", [], "Task folder names (default: the suite, eval.max_tasks of it).")
_OUTPUT = flags.DEFINE_string("output", "", "Write summary.json and attempts.jsonl into this folder.")
_STRICT = flags.DEFINE_bool("strict", False, "Stop at the first task folder that cannot run (default: refuse it, "
                            "list it with its reason, evaluate the rest).")


def main(argv):
  cfg = load_cli_config(_CONFIG.value, argv[1:])
  setup_logging(cfg.run.log_level)
  from rsi_jax.env.tasks import TaskError
  from rsi_jax.eval.run import evaluate_config
  from rsi_jax.models.checkpoint import CheckpointError
  try:
    report = evaluate_config(cfg, harness=_HARNESS.value or cfg.eval.harness,
                             repeats=_REPEATS.value or cfg.eval.repeats, checkpoint=_CHECKPOINT.value,
                             task_names=_TASKS.value, tasks_dir=_TASKS_DIR.value, strict=_STRICT.value)
  except CheckpointError as e:  # corrupted, unreadable or of another model size
    print(f"cannot load checkpoint: {e}", file=sys.stderr)
    return 2
  except (TaskError, FileNotFoundError) as e:
    print(f"cannot evaluate: {e}", file=sys.stderr)
    return 2
  print(report.render())
  if _OUTPUT.value:
    print(f"results: {report.write(_OUTPUT.value)}")
  return 0


if __name__ == "__main__":
  app.run(main)
