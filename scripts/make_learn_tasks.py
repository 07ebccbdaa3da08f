"""Write the learning check's generated task suite (rsi_jax.env.learn_tasks): OUT/train, OUT/heldout (and
OUT/base, the warm start's demonstrations, with --base N; OUT/val, a validation split, with --val N), and with --run-file CONFIG a run file OUT/run.yml
over CONFIG that names the splits (the Base phase rsr0 learns from the base split).

Usage: .venv/bin/python scripts/make_learn_tasks.py OUT [--seed 0] [--train 24] [--heldout 4] [--base 0]
       [--val 0] [--templates a,b] [--run-file configs/learn_check.yml]
"""

import argparse
import sys

from rsi_jax.env.learn_tasks import make_suite, write_run_file


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("out")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--train", type=int, default=24, help="train tasks per template")
  ap.add_argument("--heldout", type=int, default=4, help="held-out tasks per template")
  ap.add_argument("--base", type=int, default=0, help="base (warm-start demonstration) tasks per template")
  ap.add_argument("--val", type=int, default=0, help="validation tasks per template (OUT/val; not held-out)")
  ap.add_argument("--run-file", default="", help="write OUT/run.yml over this config, naming the splits")
  ap.add_argument("--templates", default="", help="comma-separated template names or sets "
                  "(one-command, multi-step; default: one-command)")
  a = ap.parse_args(argv)
  try:
    paths = make_suite(a.out, seed=a.seed, train_per_template=a.train, heldout_per_template=a.heldout,
                       base_per_template=a.base, val_per_template=a.val,
                       templates=[t for t in a.templates.split(",") if t])
  except ValueError as e:
    print(f"make_learn_tasks: {e}", file=sys.stderr)
    return 2
  for k, v in paths.items():
    print(f"{k}: {v} ({len(list(v.iterdir()))} tasks)")
  if a.run_file:
    print(f"run file: {write_run_file(paths, a.run_file, f'{a.out}/run.yml')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
