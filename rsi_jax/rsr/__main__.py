"""One RSR phase standalone: ``python -m rsi_jax.rsr [--config=FILE] [--checkpoint=DIR] [--phase=rsr1]
[--distributed] [key=value ...]``.

The same code as the training program's RSR phase (the plan is just ``[phase]``): the funnel runs with the
actor from ``--checkpoint`` (an Orbax step folder or a phase folder, whose newest step is taken; default
``model.hf_path`` or a fresh init), then SFT on Q_clean. The run folder is ``<run.output_dir>/<run.name>``
(``run.name`` defaults to the config's run name + ``-<phase>``, so a training run's folder is not touched).
At the end the funnel table is printed; the manifest, runbooks, executions and Q_clean are in
``<run folder>/phases/<phase>/``. Exit status as for ``python -m rsi_jax.train`` (2: a usage or config error,
one line).
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags

from rsi_jax import cli
from rsi_jax.config import load_cli_config, phase_kind
from rsi_jax.train import DISTRIBUTED_HELP, run_program

FLAGS = cli.flag_values()
CONFIG = flags.DEFINE_string("config", "configs/smoke.yml", "Run config file (YAML).", flag_values=FLAGS)
CHECKPOINT = flags.DEFINE_string("checkpoint", "", "Actor checkpoint (Orbax step or phase folder).", flag_values=FLAGS)
PHASE = flags.DEFINE_string("phase", "rsr1", "The RSR phase's name (rsrN): its configs/phases file applies.",
                            flag_values=FLAGS)
DISTRIBUTED = flags.DEFINE_bool("distributed", False, DISTRIBUTED_HELP, flag_values=FLAGS)


def main(argv=None) -> int:
  overrides = cli.parse(FLAGS, argv, "python -m rsi_jax.rsr", __doc__)
  phase = PHASE.value
  if phase_kind(phase) != "rsr":
    print(f"config error: --phase: {phase!r} is not an RSR phase (rsr1, rsr2, ...)", file=sys.stderr)
    return 2
  given = {o.split("=", 1)[0] for o in overrides}
  cfg = load_cli_config(CONFIG.value, overrides)
  extra = [f"pipeline.phases=[{phase}]"]
  if "run.name" not in given:
    extra.append(f"run.name={cfg.run.name}-{phase}")
  if CHECKPOINT.value:
    extra.append(f"pipeline.actor_from={{{phase}: {json.dumps(CHECKPOINT.value)}}}")

  def after(result, console):
    from rsi_jax.rsr.funnel import MANIFEST, funnel_table
    path = os.path.join(result["run_dir"], "phases", phase, MANIFEST)
    with open(path) as f:
      manifest = json.load(f)
    console.line(f"RSR funnel ({manifest['policy']}), manifest {path}:\n{funnel_table(manifest)}")

  return run_program(CONFIG.value, extra + overrides, after=after, distributed=DISTRIBUTED.value)


if __name__ == "__main__":
  cli.keep_stop_signals()
  sys.exit(main())
