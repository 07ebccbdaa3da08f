"""In-training evaluations (pipeline/evaluation.py) without a model: when one is not run (no eval.tasks_dir, a
result already in its folder, an actor an earlier evaluation of the run measured), and a resume's redone steps
losing theirs. Running one is tests/pipeline/test_driver.py's (Docker and a model)."""

import io
import json

import jax.numpy as jnp

from rsi_jax.config import CONFIG_DIR, load_config
from rsi_jax.models.checkpoint import params_digest
from rsi_jax.pipeline.console import Console
from rsi_jax.pipeline.evaluation import Evaluations

ACTOR = {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3)}


def _evals(tmp_path, *ov):
  cfg = load_config(CONFIG_DIR / "smoke.yml", [f"run.output_dir={tmp_path}", "run.name=t", *ov])
  out = io.StringIO()
  return Evaluations(cfg, str(tmp_path / "t"), Console(out=out, progress=False)), out


def _summary(ev, phase, step, digest):
  d = ev.eval_dir(phase, step)
  d.mkdir(parents=True, exist_ok=True)
  (d / "summary.json").write_text(json.dumps({"phase": phase, "step": step, "actor_digest": digest}))


def test_no_suite_no_evaluation_and_no_report(tmp_path):
  ev, out = _evals(tmp_path, "eval.tasks_dir=")  # no suite
  assert ev.evaluate_or_stop(None, "rpr1", 2, ACTOR, "here") is None  # ctx untouched: no sampler needed
  assert ev.final_report() is None
  assert not (tmp_path / "t" / "eval").exists() and out.getvalue() == ""


def test_a_step_with_a_result_is_not_evaluated_again(tmp_path):
  ev, out = _evals(tmp_path)  # the smoke config evaluates on tasks/
  _summary(ev, "rpr1", 2, "another actor")
  assert ev.evaluate(None, "rpr1", 2, ACTOR) is None
  assert out.getvalue() == ""


def test_an_actor_measured_by_an_earlier_evaluation_is_not_evaluated_again(tmp_path):
  ev, out = _evals(tmp_path)  # the smoke config evaluates on tasks/
  digest = params_digest(ACTOR)
  _summary(ev, "rpr1", 1, "another actor")
  _summary(ev, "critic_seed", 3, digest)  # e.g. the frozen actor of the critic seed, by an earlier attempt
  assert ev.evaluate_or_stop(None, "rpr1", 2, ACTOR, "here") is None
  assert out.getvalue() == (f"[rpr1] eval after step 2 skipped: the actor is the one evaluated at critic_seed "
                            f"step 3 ({digest})\n")
  assert not ev.eval_dir("rpr1", 2).exists()


def test_a_resume_drops_the_evaluations_of_the_steps_it_redoes(tmp_path):
  ev, _ = _evals(tmp_path)  # the smoke config evaluates on tasks/
  for step in (2, 4, 6):
    _summary(ev, "rpr1", step, f"actor {step}")
  _summary(ev, "rpr2", 6, "actor of rpr2")
  ev.drop_after("rpr1", 4)
  assert sorted(p.name for p in ev.eval_dir("rpr1").iterdir()) == ["2", "4"]
  assert ev.eval_dir("rpr2", 6).exists()
