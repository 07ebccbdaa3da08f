"""RPR-1 of a learning-check run again, from the run's critic-seed checkpoint; with ``--flip-advantages`` the
second broken variant (run by hand): every PPO advantage sign-flipped.

Usage: .venv/bin/python scripts/learn_check_rpr.py RUN_DIR [--flip-advantages] [key=value ...]

Starts RPR-1 from RUN_DIR's critic-seed checkpoint (actor and critic: the weights RUN_DIR's RPR-1 started
from, and the divisor table the critic was seeded with) with RUN_DIR's config, RPR-1's phase overrides and
the command line's ``key=value`` overrides (e.g.
another ``pipeline.phase_overrides``), in the run ``<name>_rpr`` or, flipped, ``<name>_flipped``. Flipped,
the one change is in the code path: every advantage TB-GAE hands the PPO loss is negated
(``rsi_jax.pipeline.rpr.linked_tb_gae`` wrapped), so the actor is pushed away from what earned reward; a
correct learning path shows RPR-1 not improving there. The in-training evaluation measures the starting
weights (``base``, step 0: RSR-1 again) and the end of the phase; the table of both is printed at the end.
"""

import sys
from pathlib import Path


def rerun(run: Path, phase: str, name: str, overrides: list) -> int:
  """``phase`` of the learning-check run ``run`` again, alone, in the run ``name`` beside it: ``run``'s config
  with that phase's overrides only (``<name>/<phase>_config.yml``), then ``overrides``. The exit status of
  ``rsi_jax.train``."""
  import yaml

  from rsi_jax.train import run_program
  cfg = yaml.safe_load((run / "config.yml").read_text())
  pipe = cfg.setdefault("pipeline", {})
  pipe["phase_overrides"] = {k: v for k, v in (pipe.get("phase_overrides") or {}).items() if k == phase}
  (run.parent / name).mkdir(parents=True, exist_ok=True)
  config = run.parent / name / f"{phase}_config.yml"
  config.write_text(yaml.safe_dump(cfg, sort_keys=False))
  return run_program(str(config), [f"run.name={name}", f"run.output_dir={run.parent}", f"pipeline.phases=[{phase}]",
                                   *overrides])


def main(argv):
  flip = "--flip-advantages" in argv
  argv = [a for a in argv if a != "--flip-advantages"]
  if not argv or argv[0].startswith("-"):
    print(__doc__, file=sys.stderr)
    return 2
  run = Path(argv[0]).resolve()
  seed_ckpt = run / "checkpoints" / "critic_seed"
  if not seed_ckpt.is_dir():
    print(f"learn_check_rpr: no critic-seed checkpoint in {run} (run scripts/learn_check.sh first)",
          file=sys.stderr)
    return 2
  if flip:
    from rsi_jax.pipeline import rpr

    correct = rpr.linked_tb_gae

    def flipped(*a, **kw):  # the deliberate bug
      res = correct(*a, **kw)
      return res._replace(advantages=-res.advantages)

    rpr.linked_tb_gae = flipped
  name = f"{run.name}_{'flipped' if flip else 'rpr'}"
  rc = rerun(run, "rpr1", name, [f"pipeline.actor_from={{rpr1: {seed_ckpt}}}",
                                 f"pipeline.critic_from={{rpr1: {seed_ckpt}}}",
                                 # the divisor table the critic was seeded with (what the run's RPR-1 carried)
                                 f"reward.divisor_table={run / 'phases' / 'critic_seed' / 'divisor_table.json'}",
                                 *argv[1:]])
  if rc == 0:
    sys.path.insert(0, str(Path(__file__).parent))
    import learn_check_table
    rc = learn_check_table.main([str(run.parent / name), "--start-label", "RSR-1 (critic-seed checkpoint)"])
  return rc


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
