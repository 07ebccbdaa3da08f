"""Evaluation runs: every task R times under a harness, scored by the protected verifier (paper §4, App. E).

Sampling follows the paper's evaluation protocol unless told otherwise: temperature 0.6, top-p 0.95, at most
8,192 output tokens per turn (``EVAL_SAMPLING``). Infrastructure failures are counted and reported; in
Mean@R and pass@R they count as failures (an attempt without a reward), in process reward they are excluded.
"""

from __future__ import annotations

import dataclasses
import uuid

import numpy as np

from rsi_jax.config import Config
from rsi_jax.eval.metrics import by_stratum, mean_at_r, pass_at_r, process_reward, strict_completions
from rsi_jax.policy import SamplingParams

EVAL_SAMPLING = SamplingParams(temperature=0.6, top_p=0.95, max_new_tokens=8192)


@dataclasses.dataclass
class EvalReport:
  tasks: list[str]
  difficulties: list[str]
  scores: np.ndarray  # (n, R) strict success, NaN for infrastructure failures
  fractions: np.ndarray  # (n, R) passed / total non-hygiene checks, NaN where no valid report
  infra_failures: int
  episodes: list = dataclasses.field(default_factory=list)  # per-attempt summaries

  def metrics(self) -> dict:
    out = {"tasks": len(self.tasks), "repeats": int(self.scores.shape[1]),
           "mean_at_r": mean_at_r(self.scores), "pass_at_r": pass_at_r(self.scores),
           "strict_completions": strict_completions(self.scores), "infra_failures": self.infra_failures}
    f = self.fractions[~np.isnan(self.fractions)]
    out["process_reward"] = process_reward(f) if f.size else None
    out["by_difficulty"] = by_stratum(self.scores, self.difficulties)
    return out

  def render(self) -> str:
    m = self.metrics()
    lines = [f"tasks {m['tasks']} x repeats {m['repeats']}",
             f"Mean@{m['repeats']}  {m['mean_at_r']:.2f}%",
             f"pass@{m['repeats']}  {m['pass_at_r']:.2f}%",
             f"process reward  {m['process_reward'] if m['process_reward'] is None else round(m['process_reward'], 4)}",
             f"strict completions  {m['strict_completions']:.2f}/{m['tasks']}",
             f"infrastructure failures  {m['infra_failures']}"]
    lines += [f"  {k}: {v['tasks']} tasks, Mean@R {v['mean_at_r']:.2f}%, pass@R {v['pass_at_r']:.2f}%"
              for k, v in m["by_difficulty"].items()]
    return "\n".join(lines)


def evaluate(pool, tasks, harness_factory, repeats: int) -> EvalReport:
  """Run every task ``repeats`` times concurrently in ``pool`` and score the attempts."""
  if repeats <= 0:
    raise ValueError(f"repeats must be > 0, got {repeats}")
  if not tasks:
    raise ValueError("no tasks to evaluate")
  futs = [[pool.submit(t, harness_factory) for _ in range(repeats)] for t in tasks]
  scores = np.full((len(tasks), repeats), np.nan)
  fractions = np.full((len(tasks), repeats), np.nan)
  infra, episodes = 0, []
  for i, row in enumerate(futs):
    for r, f in enumerate(row):
      res = f.result()
      episodes.append(res.summary())
      o = res.outcome
      if res.infra_failure:
        infra += 1
        continue
      scores[i, r] = float(o.success)
      if o.report_valid and o.total:
        fractions[i, r] = o.passed / o.total
  return EvalReport([t.name for t in tasks], [t.difficulty for t in tasks], scores, fractions, infra, episodes)


def evaluate_config(cfg: Config, *, harness: str = "json", repeats: int = 3, checkpoint: str = "",
                    task_names=(), sampling: SamplingParams = EVAL_SAMPLING) -> EvalReport:
  """Evaluate the actor (random init, or ``checkpoint``'s actor item) or the oracle on the configured tasks."""
  from rsi_jax.env import EnvPool, load_tasks, make_harness

  tasks = load_tasks(cfg.env.tasks_dir, list(task_names) or None)
  pool = EnvPool.from_config(cfg.env, f"eval-{uuid.uuid4().hex[:6]}",
                             hygiene_patterns=cfg.reward.hygiene_patterns)
  sampler = None
  try:
    if harness == "oracle":
      factory = lambda: make_harness("oracle")  # noqa: E731
    else:
      import jax

      from rsi_jax.models import Actor, ChatRenderer, build_mesh, load_tokenizer
      from rsi_jax.models.checkpoint import restore_params
      from rsi_jax.sampler.server import SamplerServer
      actor = Actor(cfg, build_mesh(cfg))
      params = (restore_params(checkpoint, actor=actor.abstract_params)["actor"] if checkpoint
                else actor.initial_params(jax.random.key(cfg.run.seed)))
      tok = load_tokenizer(cfg.model.tokenizer_path)
      sampler = SamplerServer.from_config(cfg, params, tokenizer=tok)
      renderer = ChatRenderer(tok)
      factory = lambda: make_harness(harness, sampler, renderer, sampling, env_cfg=cfg.env)  # noqa: E731
    return evaluate(pool, tasks, factory, repeats)
  finally:
    if sampler is not None:
      sampler.close()
    pool.close()
