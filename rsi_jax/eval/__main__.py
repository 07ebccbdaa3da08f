"""Evaluation entry point.

    python -m rsi_jax.eval --config=configs/smoke.yml [--harness=json|xml|oracle] [--repeats=3]
        [--checkpoint=runs/smoke/checkpoints/rpr2/final] [--tasks=a,b] [--json=out.json] [key=value ...]

Runs every task R times under the harness (the actor through the sampler at the paper's evaluation sampling:
temperature 0.6, top-p 0.95; or the reference solutions with --harness=oracle) and prints Mean@R, pass@R,
process reward, strict completions and per-difficulty results. Exit status 0 when it ran (whatever the score).
"""

from __future__ import annotations

import dataclasses
import json

from absl import app, flags

from rsi_jax.config import load_cli_config
from rsi_jax.log import setup_logging

_CONFIG = flags.DEFINE_string("config", "configs/smoke.yml", "Run config file (YAML).")
_HARNESS = flags.DEFINE_enum("harness", "json", ["json", "xml", "oracle"], "Harness to evaluate under.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Attempts per task (R of Mean@R / pass@R).")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "", "Orbax checkpoint whose 'actor' item to evaluate.")
_TASKS = flags.DEFINE_list("tasks", [], "Task folder names (default: every task in env.tasks_dir).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.6, "Sampling temperature.")
_TOP_P = flags.DEFINE_float("top_p", 0.95, "Nucleus sampling mass.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 8192, "Output tokens per turn.")
_JSON = flags.DEFINE_string("json", "", "Also write the metrics and per-attempt records to this file.")


def main(argv):
  cfg = load_cli_config(_CONFIG.value, argv[1:])
  setup_logging(cfg.run.log_level)
  from rsi_jax.eval.run import EVAL_SAMPLING, evaluate_config
  sampling = dataclasses.replace(EVAL_SAMPLING, temperature=_TEMPERATURE.value, top_p=_TOP_P.value,
                                 max_new_tokens=_MAX_NEW.value)
  report = evaluate_config(cfg, harness=_HARNESS.value, repeats=_REPEATS.value, checkpoint=_CHECKPOINT.value,
                           task_names=_TASKS.value, sampling=sampling)
  print(report.render())
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump({"metrics": report.metrics(), "episodes": report.episodes}, f, indent=1, default=str)
  return 0


if __name__ == "__main__":
  app.run(main)
