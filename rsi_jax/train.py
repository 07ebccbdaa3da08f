"""Training entry point: ``python -m rsi_jax.train --config=configs/smoke.yml key=value ...``.

Positional ``key=value`` arguments override the config (dotted keys address sections, ``model_name=``
picks a model file). The run walks the configured pipeline; see README.md.
"""

from __future__ import annotations

from absl import app, flags, logging

from rsi_jax.config import dump_config, load_cli_config
from rsi_jax.log import setup_logging

FLAGS = flags.DEFINE_string("config", "configs/smoke.yml", "Run config file (YAML).")


def main(argv):
  cfg = load_cli_config(FLAGS.value, argv[1:])
  setup_logging(cfg.run.log_level)
  logging.info("config %s with %d override(s)\n%s", FLAGS.value, len(argv) - 1, dump_config(cfg))
  from rsi_jax.pipeline.smoke import run_smoke  # heavy imports after the config is known to be valid
  summary = run_smoke(cfg)
  print(summary.render())
  return 0 if summary.ok else 1


if __name__ == "__main__":
  app.run(main)
