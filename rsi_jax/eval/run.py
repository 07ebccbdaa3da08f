"""Evaluation runs: every task R times under a harness, scored by the protected verifier (paper §4, App. E–F).

The actor runs through the same sampler and harness code as in training, at the paper's evaluation protocol
unless told otherwise (``eval.temperature`` 0.6, ``eval.top_p`` 0.95, ``eval.max_new_tokens`` 8,192 output
tokens per turn; the input limit and summarization threshold of ``env``).

Infrastructure failures (a container that cannot start, a verifier that hangs) are retried up to
``eval.infra_retries`` times; what still fails is reported apart. The headline Mean@R and pass@R count only
attempts that were scored; the paper's rule (an attempt without a reward is a failure) gives the second
figure, ``*_with_infra_as_failure``; both are printed. The figures per difficulty, family and stratum follow
the headline's rule and count the infrastructure failures beside them (a group with nothing scored: "n/a (k
infra)"); infrastructure failures are counted per kind and per task. Task folders that cannot run are refused
with their reason, listed, and the rest is evaluated (:func:`suite_tasks`). :meth:`EvalReport.write` stores
``summary.json`` (``refused``: [{task, reason}]; ``per_task.<task>.infra``: {kind: attempts}) and
``attempts.jsonl``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
from etils import epath

from rsi_jax.config import Config
from rsi_jax.eval.metrics import (by_stratum, mean_at_r, pass_at_r, process_reward, scored_mean_at_r,
                                  scored_pass_at_r, strict_completions)
from rsi_jax.eval.strata import stratum_of, stratum_scores
from rsi_jax.policy import SamplingParams

@dataclasses.dataclass
class EvalReport:
  tasks: list[str]
  difficulties: list[str]
  scores: np.ndarray  # (n, R) strict success, NaN for infrastructure failures (after retries)
  fractions: np.ndarray  # (n, R) passed / total non-hygiene checks, NaN where no valid report
  infra_failures: int  # attempts that stayed infrastructure failures after their retries
  episodes: list = dataclasses.field(default_factory=list)  # one record per attempt (attempts.jsonl)
  families: list = dataclasses.field(default_factory=list)
  strata: dict = dataclasses.field(default_factory=dict)  # the suite's frozen strata (rsi_jax.eval.strata)
  retries: int = 0  # infrastructure-failed attempts that were run again
  info: dict = dataclasses.field(default_factory=dict)  # suite, harness, checkpoint, sampling, ...
  refused: list = dataclasses.field(default_factory=list)  # [{"task", "reason"}]: folders of the suite not run
  notes: list = dataclasses.field(default_factory=list)  # what the loading adjusted (a task named twice)
  # the attempts' transcripts (rsi_jax.env.transcripts records, in the order of ``episodes``): episodes.jsonl.gz
  transcripts: list = dataclasses.field(default_factory=list, repr=False)

  def infra_by_task(self) -> dict[str, dict[str, int]]:
    """{task: {failure kind: attempts}} of the attempts that stayed infrastructure failures."""
    out: dict[str, dict[str, int]] = {}
    for e in self.episodes:
      if e.get("infra_failure"):
        kinds = out.setdefault(e["task"], {})
        kind = e.get("failure_kind") or "unknown"
        kinds[kind] = kinds.get(kind, 0) + 1
    return out

  def metrics(self) -> dict:
    s = self.scores
    scored = ~np.isnan(s)
    empty = s.size == 0
    kinds: dict[str, int] = {}
    for per in self.infra_by_task().values():
      for k, n in per.items():
        kinds[k] = kinds.get(k, 0) + n
    out = {"n_tasks": len(self.tasks), "tasks": len(self.tasks), "runs": int(s.shape[1]),
           "repeats": int(s.shape[1]),
           "mean_at_r": None if empty else scored_mean_at_r(s), "pass_at_r": None if empty else scored_pass_at_r(s),
           "mean_at_r_with_infra_as_failure": None if empty else mean_at_r(s),
           "pass_at_r_with_infra_as_failure": None if empty else pass_at_r(s),
           "strict_completions": 0.0 if empty else strict_completions(s), "infra_failures": self.infra_failures,
           "infra_by_kind": dict(sorted(kinds.items())), "infra_retries": self.retries,
           "scored_attempts": int(scored.sum()), "refused": list(self.refused), "n_refused": len(self.refused)}
    f = self.fractions[~np.isnan(self.fractions)]
    out["process_reward"] = process_reward(f) if f.size else None
    out["by_difficulty"] = by_stratum(s, self.difficulties)
    out["by_family"] = by_stratum(s, self.families) if len(self.families) == len(self.tasks) else {}
    infra = {t: sum(k.values()) for t, k in self.infra_by_task().items()}
    out["by_stratum"] = stratum_scores(self.per_task_scores(), self.strata, infra) if self.strata else {}
    return out

  def per_task_scores(self) -> dict[str, float | None]:
    """Each task's mean full-pass indicator over its scored repeats (None: no attempt was scored; the
    headline's rule, App. F counts those attempts as 0: ``mean_with_infra_as_failure`` of :meth:`summary`)."""
    return {t: float(np.nanmean(row)) if (~np.isnan(row)).any() else None for t, row in zip(self.tasks, self.scores)}

  def summary(self) -> dict:
    m = self.metrics()
    fams = self.families or [""] * len(self.tasks)
    infra = self.infra_by_task()
    per = self.per_task_scores()
    m["per_task"] = {
        t: {"family": fam, "difficulty": d, "stratum": stratum_of(self.strata, t) if self.strata else None,
            "scores": [None if np.isnan(x) else int(x) for x in row],
            "mean": per[t], "mean_with_infra_as_failure": float(np.nan_to_num(row, nan=0.0).mean()),
            "infra_failures": int(sum(infra.get(t, {}).values())), "infra": infra.get(t, {}),
            "checks": [None if np.isnan(x) else float(x) for x in frow]}
        for t, fam, d, row, frow in zip(self.tasks, fams, self.difficulties, self.scores, self.fractions)}
    m["notes"] = list(self.notes)
    m.update(self.info)
    if self.strata:
      m["strata"] = {k: self.strata.get(k) for k in ("cutoffs", "file", "definition")}
    return m

  def write(self, output_dir: str | Path) -> Path:
    """``summary.json``, ``attempts.jsonl`` and the attempts' transcripts ``episodes.jsonl.gz`` into
    ``output_dir`` (created; a local folder or an object-store URL)."""
    from rsi_jax.env.transcripts import TranscriptWriter
    d = epath.Path(output_dir)
    d.mkdir(parents=True, exist_ok=True)
    if self.transcripts:
      TranscriptWriter(d, background=False).write("episodes", self.transcripts)
    (d / "attempts.jsonl").write_text("".join(json.dumps(e, default=str) + "\n" for e in self.episodes))
    (d / "summary.json").write_text(json.dumps(self.summary(), indent=1, default=str) + "\n")
    return d

  def render(self) -> str:
    m = self.metrics()
    r = m["repeats"]
    pct = lambda x: "n/a" if x is None else f"{x:.2f}%"  # noqa: E731
    lines = [f"tasks {m['tasks']} x repeats {r}" + (f" ({m['n_refused']} task folder(s) refused, listed below)"
                                                    if m["n_refused"] else ""),
             f"Mean@{r}  {pct(m['mean_at_r'])}  (infrastructure failures as failures: "
             f"{pct(m['mean_at_r_with_infra_as_failure'])})",
             f"pass@{r}  {pct(m['pass_at_r'])}  (infrastructure failures as failures: "
             f"{pct(m['pass_at_r_with_infra_as_failure'])})",
             f"process reward  {m['process_reward'] if m['process_reward'] is None else round(m['process_reward'], 4)}",
             f"strict completions  {m['strict_completions']:.2f}/{m['tasks']}",
             f"infrastructure failures  {m['infra_failures']} (after {m['infra_retries']} retried attempt(s))"
             + "".join(f", {k} {n}" for k, n in m["infra_by_kind"].items())]
    lines += [f"  task {t}: " + ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items()))
              for t, kinds in sorted(self.infra_by_task().items())]
    groups = [(f"difficulty {k}", v) for k, v in m["by_difficulty"].items()]
    groups += [(f"family {k}", v) for k, v in m["by_family"].items()]
    if groups or m["by_stratum"]:
      lines.append("per group, as the headline: infrastructure failures left out of the scores, counted beside them")
    for name, v in groups:
      infra = f" ({v['infra_failures']} infra)" if v["infra_failures"] else ""
      if v["mean_at_r"] is None:
        lines.append(f"  {name}: {_n_tasks(v['tasks'])}, n/a{infra}")
      else:
        lines.append(f"  {name}: {_n_tasks(v['tasks'])}, Mean@R {v['mean_at_r']:.2f}%, pass@R {v['pass_at_r']:.2f}%"
                     + infra)
    for k, v in m["by_stratum"].items():
      infra = f" ({v['infra_failures']} infra)" if v.get("infra_failures") else ""
      score = "n/a" if v["score"] is None else f"{v['score']:.2f}%"
      lines.append(f"  stratum {k}: {_n_tasks(v['tasks'])}, score {score}{infra}")
    lines += [f"note: {n}" for n in self.notes]
    if self.refused:
      lines.append(f"refused {len(self.refused)} task folder(s), not evaluated:")
      lines += [f"  {x['task']}: {x['reason']}" for x in self.refused]
    return "\n".join(lines)


def _n_tasks(n: int) -> str:
  return f"{n} task" + ("" if n == 1 else "s")


def _attempt_record(res, task, run: int, tries: int) -> dict:
  from rsi_jax.env.harness import TURN_SUMMARY
  o = res.outcome
  return {"task": task.name, "family": task.family, "run": run, "success": o.success,
          "passed": o.passed, "total": o.total,
          "process_reward": (o.passed / o.total) if o.report_valid and o.total else None,
          "state": o.state.value, "reason": o.reason, "turns": len(res.turns), "prompt_tokens": res.prompt_tokens,
          "generated_tokens": res.generated_tokens, "stop_reason": res.stop_reason,
          "infra_failure": res.infra_failure, "failure_kind": res.failure_kind, "error": res.error,
          "tries": tries, "episode_id": res.episode_id, "seconds": round(res.total_s, 2),
          # what the agent did, to read why an attempt failed: each turn's command (cut) or malformed action
          "actions": [_action(t) for t in res.turns if t.kind != TURN_SUMMARY]}


ACTION_CHARS = 300  # per action in attempts.jsonl


def _action(turn) -> str:
  if turn.command is not None:
    text = turn.command
  elif turn.error:
    text = f"<malformed: {turn.error}> {turn.text}"
  else:
    text = "<done>" if turn.done else turn.text
  return text if len(text) <= ACTION_CHARS else text[:ACTION_CHARS] + "..."


def evaluate(pool, tasks, harness_factory, repeats: int, *, infra_retries: int = 0, strata: dict | None = None,
             info: dict | None = None, stop=None, abort=None, output_cap_bytes: int | None = None,
             seed: int | None = None) -> EvalReport:
  """Run every task ``repeats`` times concurrently in ``pool`` (an attempt that is an infrastructure failure
  runs again, up to ``infra_retries`` times) and score the attempts. ``seed``: each attempt's harness is made by
  ``harness_factory(seed=derive_seed(seed, task, repeat, try))``, so its sampling does not depend on which
  attempts ran beside it (None: ``harness_factory()``). ``stop``: a stop notice
  (:mod:`rsi_jax.stop`); once it is there, ``abort`` (the switch the attempts' containers and, through the
  harness's policy, their sampler requests watch) is set, queued attempts are cancelled, running ones waited
  for, and :class:`~rsi_jax.stop.StopRequested` is raised: nothing of the evaluation is returned."""
  import threading

  from rsi_jax.stop import StopRequested, abort_all
  if repeats <= 0:
    raise ValueError(f"repeats must be > 0, got {repeats}")
  if not tasks:
    raise ValueError("no tasks to evaluate")
  if stop is not None and abort is None:
    abort = threading.Event()
  def factory(i: int, r: int, tries: int):
    if seed is None:
      return harness_factory
    from rsi_jax.env.rollouts import derive_seed
    return functools.partial(harness_factory, seed=derive_seed(seed, tasks[i].name, r, tries))

  pending = {(i, r): (pool.submit(t, factory(i, r, 1), abort=abort), 1)
             for i, t in enumerate(tasks) for r in range(repeats)}
  scores = np.full((len(tasks), repeats), np.nan)
  fractions = np.full((len(tasks), repeats), np.nan)
  infra, retries, records, transcripts = 0, 0, {}, {}
  while pending:
    if stop is not None and stop.requested:
      abort_all([f for f, _ in pending.values()], [abort])
      raise StopRequested(stop.signal_name)
    for key in list(pending):
      fut, tries = pending[key]
      if not fut.done():
        continue
      del pending[key]
      i, r = key
      res = fut.result()
      if res.infra_failure and tries <= infra_retries:
        retries += 1
        pending[key] = (pool.submit(tasks[i], factory(i, r, tries + 1), abort=abort), tries + 1)
        continue
      records[key] = _attempt_record(res, tasks[i], r, tries)
      transcripts[key] = _transcript(res, tasks[i], r, tries, output_cap_bytes)
      o = res.outcome
      if res.infra_failure:
        infra += 1
        continue
      scores[i, r] = float(o.success)
      if o.report_valid and o.total:
        fractions[i, r] = o.passed / o.total
    if pending:
      time.sleep(0.05)
  return EvalReport([t.name for t in tasks], [t.difficulty for t in tasks], scores, fractions, infra,
                    [records[k] for k in sorted(records)], [t.family for t in tasks], strata or {}, retries,
                    dict(info or {}), transcripts=[transcripts[k] for k in sorted(transcripts)])


def _transcript(res, task, run: int, tries: int, output_cap_bytes) -> dict:
  from rsi_jax.env.transcripts import episode_record
  return episode_record(res, index=run, instruction=task.instruction, output_cap_bytes=output_cap_bytes,
                        extra={"run": run, "tries": tries, "difficulty": task.difficulty})


def eval_sampling(cfg: Config) -> SamplingParams:
  e = cfg.eval
  return SamplingParams(temperature=e.temperature, top_p=e.top_p, max_new_tokens=e.max_new_tokens)


@dataclasses.dataclass
class SuiteTasks:
  """The tasks an evaluation runs, the suite's frozen strata, and every folder it refused (with why)."""
  tasks: list
  strata: dict
  refused: list = dataclasses.field(default_factory=list)  # [{"task", "reason"}]
  notes: list = dataclasses.field(default_factory=list)


def image_presence(pool) -> Callable[[str], bool]:
  """Whether an image is present on every live Docker endpoint of ``pool`` (answers cached)."""
  from rsi_jax.env.images import _image_exists
  clients = [c for c in pool.clients.values() if c is not None]
  seen: dict[str, bool] = {}

  def present(name: str) -> bool:
    if name not in seen:
      seen[name] = bool(clients) and all(_image_exists(c, name) for c in clients)
    return seen[name]
  return present


def suite_tasks(cfg: Config, tasks_dir: str, task_names=(), *, harness: str | None = None, strict: bool = False,
                pool=None) -> SuiteTasks:
  """The suite's tasks: the named ones, or ``eval.max_tasks`` of it; every folder that cannot run is refused
  with its reason (:func:`rsi_jax.env.tasks.load_suite`; with ``pool``, a base image only a registry has; under
  the ``oracle`` harness, a task without a reference solution), or with ``strict`` stops the evaluation
  (:class:`~rsi_jax.env.tasks.TaskError`)."""
  from rsi_jax.env.harness import HARNESSES
  from rsi_jax.env.dockerfiles import image_check
  from rsi_jax.env.tasks import TaskError, load_suite
  from rsi_jax.eval.strata import suite_strata
  from rsi_jax.env.rollouts import pick_tasks
  images = image_check(pool.settings.image_map, image_presence(pool)) if pool is not None else None
  everything = load_suite(tasks_dir, strict=strict and not task_names, images=images)
  strata = suite_strata(everything.tasks, tasks_dir) if everything.tasks else {}
  if task_names:
    suite = load_suite(tasks_dir, list(task_names), strict=strict, images=images)
    tasks = suite.tasks
  else:
    suite, tasks = everything, pick_tasks(everything.tasks, cfg.eval.max_tasks)
  refused = [r.to_dict() for r in suite.refused]
  runner = HARNESSES.get(harness or cfg.eval.harness)
  kept = []
  for t in tasks:
    why = runner.refusal(t) if runner is not None else None
    if why and strict:
      raise TaskError(f"{t.path}: {why}", why)
    if why:
      refused.append({"task": t.name, "reason": why})
    else:
      kept.append(t)
  return SuiteTasks(kept, strata, sorted(refused, key=lambda x: x["task"]), list(suite.notes))


def evaluate_policy(cfg: Config, pool, tasks, policy, renderer, *, strata=None, harness: str | None = None,
                    repeats: int | None = None, info: dict | None = None, refused=(), notes=(),
                    stop=None) -> EvalReport:
  """The actor behind ``policy`` (e.g. the training program's sampler) on ``tasks`` under the configured
  harness and evaluation sampling: the code path of ``python -m rsi_jax.eval`` and in-training evaluation.
  ``refused`` / ``notes``: what loading the suite refused or adjusted, kept with the results (no task left:
  an empty report that lists them). ``stop``: a stop notice aborts the evaluation (:func:`evaluate`), its
  sampler requests cancelled too. With ``rollout.deterministic`` every attempt samples from its own seed (the
  run's seed, the task, the repeat): the same weights give the same evaluation on a rerun."""
  import threading

  from rsi_jax.env import make_harness
  from rsi_jax.env.rollouts import RolloutPolicy, derive_seed
  harness = harness or cfg.eval.harness
  sampling = eval_sampling(cfg)
  abort = threading.Event() if stop is not None else None
  seed = derive_seed(cfg.run.seed, "eval") if cfg.rollout.deterministic and harness != "oracle" else None

  def agent(seed=None):
    if abort is None and seed is None:
      return policy
    # the attempt's sampler calls end on the abort switch; seeded, the n-th call samples from (seed, n)
    return RolloutPolicy(policy, abort if abort is not None else threading.Event(), seed)

  if harness == "oracle":
    factory = lambda: make_harness("oracle")  # noqa: E731
  else:
    factory = lambda seed=None: make_harness(harness, agent(seed), renderer, sampling,  # noqa: E731
                                             env_cfg=cfg.env)
  info = {"harness": harness, "sampling": dataclasses.asdict(sampling), **(info or {})}
  repeats = repeats or cfg.eval.repeats
  if tasks:
    rep = evaluate(pool, tasks, factory, repeats, infra_retries=cfg.eval.infra_retries, strata=strata, info=info,
                   stop=stop, abort=abort, output_cap_bytes=cfg.env.output_cap_bytes, seed=seed)
  else:
    rep = EvalReport([], [], np.zeros((0, repeats)), np.zeros((0, repeats)), 0, strata=strata or {}, info=info)
  rep.refused, rep.notes = list(refused), list(notes)
  return rep


def evaluate_config(cfg: Config, *, harness: str = "json", repeats: int = 3, checkpoint: str = "",
                    task_names=(), sampling: SamplingParams | None = None, tasks_dir: str = "",
                    strict: bool = False) -> EvalReport:
  """Evaluate the actor (random init, or ``checkpoint``'s actor item) or the oracle on a suite
  (``tasks_dir``, else ``eval.tasks_dir``, else ``env.tasks_dir``). Folders that cannot run are refused and
  listed (``strict``: the first one stops it, :class:`~rsi_jax.env.tasks.TaskError`)."""
  from rsi_jax.env import EnvPool
  from rsi_jax.env.tasks import TaskError

  tasks_dir = tasks_dir or cfg.eval.tasks_dir or cfg.env.tasks_dir
  if not Path(tasks_dir).is_dir():
    raise TaskError(f"{tasks_dir}: tasks directory does not exist")
  if sampling is not None:
    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, temperature=sampling.temperature,
                                                            top_p=sampling.top_p,
                                                            max_new_tokens=sampling.max_new_tokens))
  pool = EnvPool.from_config(cfg.env, f"eval-{uuid.uuid4().hex[:6]}",
                             hygiene_patterns=cfg.reward.hygiene_patterns)
  sampler = renderer = None
  info = {"suite": Path(tasks_dir).name, "tasks_dir": str(tasks_dir), "checkpoint": checkpoint or None}
  try:
    suite = suite_tasks(cfg, tasks_dir, task_names, harness=harness, strict=strict, pool=pool)
    pool.check_base_images(suite.tasks)  # warns, before any build, for each family image that is not built
    if harness != "oracle" and suite.tasks:
      import jax

      from rsi_jax.models import Actor, ChatRenderer, build_mesh, load_tokenizer
      from rsi_jax.models.checkpoint import resolve_checkpoint, restore_params
      from rsi_jax.sampler.server import SamplerServer
      actor = Actor(cfg, build_mesh(cfg))
      params = (restore_params(resolve_checkpoint(checkpoint), actor=actor.abstract_params)["actor"]
                if checkpoint else actor.initial_params(jax.random.key(cfg.run.seed)))
      tok = load_tokenizer(cfg.model.tokenizer_path)
      sampler = SamplerServer.from_config(cfg, params, tokenizer=tok)
      renderer = ChatRenderer(tok)
    return evaluate_policy(cfg, pool, suite.tasks, sampler, renderer, strata=suite.strata, harness=harness,
                           repeats=repeats, info=info, refused=suite.refused, notes=suite.notes)
  finally:
    if sampler is not None:
      sampler.close()
    pool.close()
