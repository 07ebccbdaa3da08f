"""Evaluations during training: when they are skipped, where they are written, reuse of a measured actor.

The driver (:mod:`rsi_jax.pipeline.driver`) evaluates the first phase's starting actor, every
``pipeline.eval_every`` steps and each phase's final weights (``eval.tasks_dir``; none when it is unset)
through :meth:`Evaluations.evaluate_or_stop`. Each goes to ``<run>/eval/<phase>/<step>/`` (its
``summary.json`` records the actor's digest), ``eval/metrics.jsonl`` and TensorBoard; one whose folder already
holds a result (a resumed run) is not run again, nor one of an actor an evaluation of this run already
measured (e.g. the critic seed's frozen actor). A stop notice cuts an evaluation without writing anything of
it, so the rerun evaluates again. After the last phase, :meth:`Evaluations.final_report` writes the stage
report (``<run>/eval/report/``).
"""

from __future__ import annotations

import json

from etils import epath

from rsi_jax.config import Config
from rsi_jax.models.checkpoint import params_digest
from rsi_jax.pipeline import multihost
from rsi_jax.pipeline.preemption import Preempted
from rsi_jax.stop import StopRequested


class Evaluations:
  """The in-training evaluations of one run folder; ``metrics`` (the run's
  :class:`~rsi_jax.pipeline.metrics.MetricLogger`) is set before the first one."""

  def __init__(self, cfg: Config, run_dir: str, console):
    self.cfg, self.run_dir, self.console = cfg, run_dir, console
    self.metrics = None
    self._evaluated: dict[str, str] = {}  # actor digest -> the evaluation that measured it

  def eval_dir(self, phase: str, step: int | None = None):
    d = epath.Path(self.run_dir) / "eval" / phase
    return d if step is None else d / str(step)

  def drop_after(self, phase: str, step: int):
    """Remove ``phase``'s evaluations of the steps after ``step`` (a resume redoes them; first process)."""
    evals = self.eval_dir(phase)
    for d in (evals.glob("*") if evals.exists() and multihost.is_primary() else []):
      if d.name.isdigit() and int(d.name) > step:
        d.rmtree()

  def evaluate_or_stop(self, ctx, phase: str, step: int, actor_params, where: str, saved: bool = True):
    """:meth:`evaluate`; a stop notice during it stops the run (:class:`Preempted`: ``where``, ``saved``) and
    leaves no result of the cut evaluation, so the rerun evaluates again."""
    try:
      return self.evaluate(ctx, phase, step, actor_params)
    except StopRequested as e:
      raise Preempted(where, str(e), saved=saved) from None

  def evaluate(self, ctx, phase: str, step: int, actor_params):
    """In-training evaluation (``eval.tasks_dir``): the actor through the sampler and harness code of
    ``python -m rsi_jax.eval``, into ``<run>/eval/<phase>/<step>/``, ``eval/metrics.jsonl`` and TensorBoard
    (``eval/<suite>/*``). Skipped when that folder already holds a result (a resumed run). A stop notice
    (``ctx.stop``) aborts it: :class:`~rsi_jax.stop.StopRequested`, nothing written."""
    cfg = self.cfg
    if not cfg.eval.tasks_dir:
      return None
    out = self.eval_dir(phase, step)
    if multihost.from_primary((out / "summary.json").exists):
      return None
    digest = params_digest(actor_params)
    # e.g. the critic seed's frozen actor: the same weights were just measured (or by an earlier attempt)
    where = self._evaluated.get(digest) or multihost.from_primary(self._measured, digest)
    if where:
      self.console.line(f"[{phase}] eval after step {step} skipped: the actor is the one evaluated at "
                        f"{where} ({digest})")
      return None
    ctx.serve(actor_params)  # on every process (the weight sync is collective)
    # the first process runs the evaluation and writes its report; the others wait for its metrics
    m = multihost.from_primary(self._evaluate_here, ctx, phase, step, digest, out)
    self._evaluated[digest] = f"{phase} step {step}"
    return m

  def _measured(self, digest: str) -> str | None:
    """Which evaluation in the run folder (an earlier attempt's) measured the actor ``digest``, if any."""
    root = epath.Path(self.run_dir) / "eval"
    for f in sorted(root.glob("*/*/summary.json")) if root.exists() else []:
      try:
        info = json.loads(f.read_text())
      except ValueError:
        continue
      if isinstance(info, dict) and info.get("actor_digest") == digest:
        return f"{info.get('phase')} step {info.get('step')}"
    return None

  def _evaluate_here(self, ctx, phase: str, step: int, digest: str, out):
    from rsi_jax.eval.run import evaluate_policy, suite_tasks
    cfg = self.cfg
    if ctx.eval_suite is None:  # refused folders are listed (in summary.json too), never stop the run
      s = suite_tasks(cfg, cfg.eval.tasks_dir, pool=ctx.pool)
      ctx.eval_suite = (s.tasks, s.strata, s.refused, s.notes)
      for r in s.refused:
        self.console.line(f"warning: evaluation task folder {r['task']} of {cfg.eval.tasks_dir} refused: "
                          f"{r['reason']}")
    tasks, strata, refused, notes = ctx.eval_suite
    suite = epath.Path(cfg.eval.tasks_dir).name
    rep = evaluate_policy(cfg, ctx.pool, tasks, ctx.sampler, ctx.renderer, strata=strata,
                          info={"suite": suite, "tasks_dir": cfg.eval.tasks_dir, "phase": phase, "step": step,
                                "actor_digest": digest}, refused=refused, notes=notes, stop=ctx.stop)
    out.mkdir(parents=True, exist_ok=True)
    rep.write(out)
    m = rep.metrics()
    keep = {k: m[k] for k in ("mean_at_r", "pass_at_r", "mean_at_r_with_infra_as_failure", "process_reward",
                              "strict_completions", "infra_failures")}
    self.metrics.log_eval(phase, step, suite, keep)
    pct = lambda x: "n/a" if x is None else f"{x:.1f}%"  # noqa: E731
    self.console.line(f"[{phase}] eval after step {step} on {suite} ({m['n_tasks']} tasks x {m['runs']}): "
                      f"Mean@{m['runs']} {pct(m['mean_at_r'])}, pass@{m['runs']} {pct(m['pass_at_r'])}, "
                      f"infrastructure failures {m['infra_failures']}")
    return m

  def final_report(self):
    """The stage report over every phase's last evaluation (``<run>/eval/report/``)."""
    if not self.cfg.eval.tasks_dir:
      return None
    from rsi_jax.eval.report import report_run
    out = epath.Path(self.run_dir) / "eval" / "report"
    try:
      report_run(self.run_dir, str(out))
    except FileNotFoundError:
      return None
    self.console.line(f"evaluation report: {out / 'report.md'}")
    return str(out)
