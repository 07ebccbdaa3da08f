"""The Recursive Self-Rewrite funnel (paper §2.1, Eq. 2–3; SPEC §5): discovery → C(τ) → planning → review →
fresh execution → leakage screen → projection → Q_clean.

:func:`run_funnel` runs it for one RSR phase and returns Q_clean's samples, a record per accepted item and a
manifest with the count of every stage (overall, per task family, per discovery harness). Infrastructure
failures (a container that died, a verifier that hung) are counted apart and never scored.
:class:`QClean` serves the accepted multiset to SFT as a grain data source (uniform sampling, multiplicities
kept, a checkpointable iterator).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Sequence

import grain
import numpy as np
from etils import epath

from rsi_jax.env.harness import ChatHarness, Segment
from rsi_jax.env.records import episode_from_json, episode_to_json
from rsi_jax.env.tasks import tasks_digest
from rsi_jax.policy import FINISH_LENGTH, FINISH_REJECTED, SamplingParams
from rsi_jax.rl.batch import Sample, episode_samples, save_samples
from rsi_jax.rl.outcome_table import outcome_row
from rsi_jax.rsr.control import strip_control
from rsi_jax.rsr.review import ModelJudge, review, screen_trajectory
from rsi_jax.rsr.progress import FunnelProgress
from rsi_jax.rsr.runbook import load_template, parse_runbook
from rsi_jax.stop import wait_all

STAGES = ("attempted", "discovered", "planned", "reviewed", "executed", "verified", "leak_screened", "accepted")
MANIFEST = "rsr_manifest.json"


class ProjectionError(RuntimeError):
  """A trajectory's prompt is not the one its harness renders: it cannot be projected safely."""


@dataclasses.dataclass
class FunnelResult:
  episodes: list[list[Sample]]  # Q_clean, one entry per accepted execution (the multiset)
  records: list[dict]  # what each entry is: task, family, discovery harness, runbook, repeat, episode id
  manifest: dict


class StageCounts:
  def __init__(self):
    self.total = collections.Counter()
    self.family = collections.defaultdict(collections.Counter)
    self.harness = collections.defaultdict(collections.Counter)

  def add(self, key: str, family: str, harness: str, n: int = 1):
    self.total[key] += n
    self.family[family][key] += n
    self.harness[harness][key] += n

  def table(self, c: collections.Counter) -> dict:
    d = {s: int(c.get(s, 0)) for s in STAGES}
    d["review_rejected"] = int(c.get("review_rejected", 0))  # runbooks (one may have several reasons)
    d["rejected"] = {k[len("rejected:"):]: int(v) for k, v in sorted(c.items()) if k.startswith("rejected:")}
    d["infra_failures"] = {k[len("infra:"):]: int(v) for k, v in sorted(c.items()) if k.startswith("infra:")}
    return d


def project(result, harness: ChatHarness, task) -> list[Segment]:
  """𝒫: the executed trajectory conditioned on the public instruction only. Each segment's initial prompt
  (system prompt, private guidance I_exec ⊕ x_pub ⊕ b, the summary of earlier segments) is replaced by the
  prompt the harness renders without guidance; the sampled ids, their generated-token mask, logprobs,
  weight versions and the observations that follow are kept exactly."""
  summaries = {t.segment: t.text for t in result.turns if t.kind == "summary"}
  out = []
  for seg in result.segments:
    first = next((t for t in result.turns if t.segment == seg.index), None)
    if first is None:
      raise ProjectionError(f"{task.name} segment {seg.index}: no turn recorded for it")
    n = len(first.prompt_ids)
    summary = summaries.get(seg.index - 1)
    private = np.asarray(harness.initial_prompt(task, summary=summary, private=True), np.int32)
    if len(private) != n or not np.array_equal(seg.ids[:n], private) or seg.gen_mask[:n].any():
      raise ProjectionError(f"{task.name} segment {seg.index}: its prompt is not the harness's guided prompt")
    public = np.asarray(harness.initial_prompt(task, summary=summary, private=False), np.int32)
    k = len(public)
    out.append(Segment(seg.index, np.concatenate([public, seg.ids[n:]]).astype(np.int32),
                       np.concatenate([np.zeros(k, bool), seg.gen_mask[n:]]),
                       np.concatenate([np.zeros(k, np.float32), seg.logprobs[n:]]).astype(np.float32),
                       np.concatenate([np.full(k, -1, np.int32), seg.turn_ids[n:]]).astype(np.int32),
                       np.concatenate([np.full(k, -1, np.int32), seg.weight_versions[n:]]).astype(np.int32)))
  return out


class QClean(grain.sources.RandomAccessDataSource):
  """Q_clean as a grain data source: item i is the index of the i-th accepted trajectory (several accepted
  executions of one runbook or task are several items: the multiset's multiplicities)."""

  def __init__(self, records: Sequence[dict]):
    self.records = list(records)

  def __len__(self):
    return len(self.records)

  def __getitem__(self, i):
    return int(i)

  def batches(self, seed: int, epochs: int, batch_size: int) -> grain.MapDataset:
    """``epochs`` passes, each a fresh seeded permutation (uniform sampling without replacement within a
    pass), in batches of ``batch_size`` item indices (the last may be short)."""
    return grain.MapDataset.source(self).seed(int(seed)).shuffle().repeat(int(epochs)).batch(int(batch_size))


def run_funnel(cfg, tasks, pool, renderer, policy_for: Callable[[tuple], object], *, label: str,
               workdir: str | None = None, log: Callable[[str], None] = lambda s: None,
               input_digest: str | None = None, stop=None, abort: threading.Event | None = None
               ) -> FunnelResult:
  """One RSR funnel over ``tasks`` with the actor behind ``policy_for(tag)`` (a Policy per episode or call;
  ``tag`` names it, for seeding). ``cfg``: the phase's :class:`~rsi_jax.config.Config`; ``input_digest``:
  the actor's digest, recorded in the manifest. ``stop``: a stop notice (:mod:`rsi_jax.stop`); once it is
  given, the stage running sets ``abort`` (the switch of its episodes and the actor's calls), cancels what has not
  started, waits for what runs and raises :class:`~rsi_jax.stop.StopRequested`."""
  aborts = [abort] if abort is not None else []
  from rsi_jax.env import make_harness
  r, ro = cfg.rsr, cfg.rollout
  plan_t, exec_t = load_template(r.plan_template), load_template(r.exec_template)
  judge_t = load_template(r.judge_template) if r.judge else None
  sampling = SamplingParams(temperature=ro.temperature, top_p=ro.top_p, top_k=ro.top_k,
                            max_new_tokens=ro.max_new_tokens)
  plan_sampling = dataclasses.replace(sampling, max_new_tokens=r.runbook_max_tokens)
  counts = StageCounts()
  network = cfg.env.network != "none"
  templates = {"plan": plan_t, "exec": exec_t, "judge": judge_t}
  progress = None if workdir is None else FunnelProgress(workdir, {
      "input_actor_digest": input_digest, "tasks_digest": tasks_digest(tasks), "policy": label,
      "settings": _settings(r), "templates": {k: t.digest for k, t in templates.items() if t is not None}})

  def start(stage: str, i: int, submit, to_record, from_record):
    """Unit ``i`` of ``stage``: its recorded result, or started now and recorded when it finishes."""
    if progress is not None and i in progress.done[stage]:
      fut = cf.Future()
      fut.set_result(from_record(progress.done[stage][i]))
      return fut
    fut = submit()
    if progress is not None:
      fut.add_done_callback(progress.recorder(stage, i, to_record, keep=_not_aborted))
    return fut

  # 1. discovery: every task under every harness, rsr.discovery_attempts times; keep what verifies
  jobs = [(t, h, a) for t in tasks for h in r.harnesses for a in range(r.discovery_attempts)]
  futs = [start("discovery", j, lambda t=t, h=h, a=a: pool.submit(
      t, make_harness(h, policy_for(("discover", t.name, h, a)), renderer, sampling, env_cfg=cfg.env), abort=abort),
      episode_to_json, episode_from_json) for j, (t, h, a) in enumerate(jobs)]
  discovered, outcomes = [], []
  results = wait_all(futs, stop, aborts)
  _keep_stage(workdir, cfg, "discovery", [(t, res, {"attempt": a}) for (t, h, a), res in zip(jobs, results)])
  for (t, h, _), res in zip(jobs, results):
    outcomes.append(outcome_row(0, res))  # the verifier's reports: FDR calibration of later rollout phases
    counts.add("attempted", t.family, h)
    if res.infra_failure:
      counts.add(f"infra:discovery:{res.failure_kind or 'unknown'}", t.family, h)
    elif res.success == 1:
      counts.add("discovered", t.family, h)
      discovered.append((t, h, res))
  log(f"discovery: {len(discovered)} verified of {len(jobs)} episodes")
  if r.num_runbooks == 0:  # the runbook stage off: verified self-imitation
    return _self_imitation(cfg, tasks, discovered, counts, label, workdir, input_digest, log, outcomes, progress)

  # 2-3. planning from C(τ), then the review gate
  judge = ModelJudge(policy_for(("judge",)), renderer, judge_t, dataclasses.replace(
      sampling, temperature=0.0, max_new_tokens=64)) if judge_t is not None else None
  plans = [(d, k) for d in range(len(discovered)) for k in range(r.num_runbooks)]

  def plan_prompt(d: int) -> list[int]:
    t, h, res = discovered[d]
    return planning_prompt(plan_t, t.instruction, strip_control(res.messages(), h, r.transcript_output_chars),
                           renderer)

  def plan(d: int, k: int):
    t, h, _ = discovered[d]
    ids = plan_prompt(d)
    comp = policy_for(("plan", t.name, h, d, k)).generate(ids, plan_sampling)
    if comp.finish_reason == FINISH_REJECTED:
      return "planning_prompt_too_long", None
    if comp.finish_reason == FINISH_LENGTH:  # cut at rsr.runbook_max_tokens: not a whole runbook
      return "planning_truncated", None
    return None, parse_runbook(renderer.decode([i for i in comp.token_ids if i not in renderer.eos_ids]))

  with cf.ThreadPoolExecutor(max(1, min(16, len(plans) or 1)), thread_name_prefix="rsr-plan") as ex:
    texts = wait_all([start("planning", i, lambda p=p: ex.submit(plan, *p), list, tuple)
                      for i, p in enumerate(plans)], stop, aborts)
  runbooks, accepted_runbooks, plans_kept = [], [], []
  for (d, k), (failed, text) in zip(plans, texts):
    t, h, res = discovered[d]
    if text is None:
      counts.add(f"rejected:{failed}", t.family, h)
      runbooks.append({"task": t.name, "harness": h, "discovery": res.episode_id, "k": k, "runbook": None,
                       "accepted": False, "reasons": [failed], "details": []})
      continue
    counts.add("planned", t.family, h)
    v = review(t, text, judge=judge, network=network)
    for reason in v.reasons:
      counts.add(f"rejected:{reason}", t.family, h)
    if not v.accepted:
      counts.add("review_rejected", t.family, h)
    if v.accepted:
      counts.add("reviewed", t.family, h)
      accepted_runbooks.append((len(runbooks), t, h, text))
      if r.plan_demonstrations:  # the warm start's demonstration of the runbook format (rsr.policy scripted)
        plans_kept.append((planning_sample(plan_prompt(d), text, renderer),
                           {"task": t.name, "family": t.family, "harness": h, "runbook": len(runbooks), "repeat": 0,
                            "episode_id": None, "kind": "planning"}))
    runbooks.append({"task": t.name, "harness": h, "discovery": res.episode_id, "k": k, "runbook": text,
                     "accepted": v.accepted, "reasons": list(v.reasons), "details": list(v.details)})
  log(f"planning: {len(accepted_runbooks)} of {len(plans)} runbooks passed review")

  # 4. fresh execution under H0 with private guidance, M repeats per accepted runbook
  ex_jobs = []
  for rb_id, t, h, text in accepted_runbooks:
    for m in range(r.num_repeats):
      guide = (lambda task, text=text: exec_t.render(instruction=task.instruction.strip(), runbook=text))
      harness = make_harness(r.target_harness, policy_for(("execute", t.name, rb_id, m)), renderer, sampling,
                             env_cfg=cfg.env, guidance=guide)
      run = lambda t=t, harness=harness: pool.submit(t, harness, abort=abort)  # noqa: E731
      ex_jobs.append((rb_id, t, h, m, harness,
                      start("execution", len(ex_jobs), run, episode_to_json, episode_from_json)))
  episodes, records, executions, guided_kept = [], [], [], []
  results = wait_all([j[-1] for j in ex_jobs], stop, aborts)
  _keep_stage(workdir, cfg, "execution", [(t, res, {"runbook": rb_id, "repeat": m, "discovery_harness": h})
                                          for (rb_id, t, h, m, _, _), res in zip(ex_jobs, results)])
  for (rb_id, t, h, m, harness, _), res in zip(ex_jobs, results):
    counts.add("executed", t.family, h)
    row = {"task": t.name, "runbook": rb_id, "repeat": m, "episode_id": res.episode_id,
           "success": res.success, "failure_kind": res.failure_kind, "leakage": []}
    if res.infra_failure:
      counts.add(f"infra:execution:{res.failure_kind or 'unknown'}", t.family, h)
    elif execution_verified(res):
      counts.add("verified", t.family, h)
      screen = screen_trajectory(t, res)
      row["leakage"] = list(screen.reasons)
      if screen.accepted:
        counts.add("leak_screened", t.family, h)
        # 5. projection: conditioned on the public instruction only
        try:
          segments = project(res, harness, t)
        except ProjectionError as e:
          counts.add("rejected:projection", t.family, h)
          row["error"] = str(e)
        else:
          episodes.append(episode_samples(segments, len(episodes)))
          records.append({"task": t.name, "family": t.family, "harness": h, "runbook": rb_id, "repeat": m,
                          "episode_id": res.episode_id})
          counts.add("accepted", t.family, h)
          if r.plan_demonstrations:  # the warm start's demonstration of following a runbook: guided, unprojected
            guided_kept.append((res.segments, {"task": t.name, "family": t.family, "harness": h, "runbook": rb_id,
                                               "repeat": m, "episode_id": res.episode_id, "kind": "guided"}))
      else:
        for reason in screen.reasons:
          counts.add(f"rejected:screen:{reason}", t.family, h)
    executions.append(row)
  log(f"execution: {len(records)} accepted of {len(ex_jobs)} runs")
  for sample, rec in plans_kept:  # after the executions: Q_clean's trajectories keep their indices
    episodes.append([dataclasses.replace(sample, episode=len(episodes))])
    records.append(rec)
  for segments, rec in guided_kept:
    episodes.append(episode_samples(segments, len(episodes)))
    records.append(rec)
  if plans_kept:
    log(f"planning demonstrations: {len(plans_kept)} accepted runbooks are SFT samples too, and "
        f"{len(guided_kept)} accepted executions as run under their guidance")

  return finish_funnel(cfg, tasks, counts, label, input_digest, templates, workdir, episodes, records, runbooks,
                       executions, outcomes, progress)


def planning_prompt(plan_t, instruction: str, transcript: str, renderer) -> list[int]:
  """The planning call's prompt ids: I_plan over the public instruction and C(τ) (the harness-neutral text of
  :func:`rsi_jax.rsr.control.render_steps`), one user message, the generation prompt."""
  text = plan_t.render(instruction=instruction.strip(), transcript=transcript.strip())
  return [int(i) for i in renderer.render([{"role": "user", "content": text}], add_generation_prompt=True).ids]


def planning_sample(prompt_ids: Sequence[int], runbook: str, renderer) -> Sample:
  """A planning call as an SFT sample: the planning prompt (through the generation prompt), then the runbook
  and ``<|im_end|>`` as the generated tokens (the runbook's text encoded as plain text, as a reply is)."""
  reply = renderer.tok.encode_text(runbook) + [renderer.tok.im_end_id]
  n, m = len(prompt_ids), len(reply)
  gen = np.r_[np.zeros(n, bool), np.ones(m, bool)]
  return Sample(np.asarray([*prompt_ids, *reply], np.int32), gen, np.zeros(n + m, np.float32),
                np.where(gen, 0, -1).astype(np.int32), 0, np.where(gen, 0, -1).astype(np.int32))


def execution_verified(res) -> bool:
  """Whether a fresh execution (not an infrastructure failure) passed its verifier: the gate into Q_clean.
  ``scripts/learn_check_rewrite.py --broken`` replaces it (the learning check's broken RSR variant: SFT on the
  executions the verifier rejected)."""
  return res.success == 1


def _keep_stage(workdir, cfg, stage: str, items):
  """A stage's episodes ((task, result, extra fields) each) as ``<workdir>/episodes/<stage>.jsonl.gz``: every
  one of them (the funnel's view reads discovery -> runbooks -> executions from these)."""
  if workdir is None:
    return
  from rsi_jax.env.transcripts import TranscriptWriter, episode_record
  TranscriptWriter(epath.Path(workdir) / "episodes", background=False).write(stage, [
      episode_record(res, index=j, instruction=t.instruction, output_cap_bytes=cfg.env.output_cap_bytes,
                     extra={"stage": stage, **extra}) for j, (t, res, extra) in enumerate(items)])


def _not_aborted(res) -> bool:
  """What a progress record may hold: a planning result, or an episode not stopped by a stop notice."""
  from rsi_jax.env.episode import ABORTED
  return getattr(res, "failure_kind", "") != ABORTED


def _settings(r) -> dict:
  return {"harnesses": list(r.harnesses), "target_harness": r.target_harness,
          "discovery_attempts": r.discovery_attempts, "num_runbooks": r.num_runbooks,
          "num_repeats": r.num_repeats, "judge": bool(r.judge), "families": list(r.families)}


def _self_imitation(cfg, tasks, discovered, counts, label, workdir, input_digest, log, outcomes,
                    progress=None) -> FunnelResult:
  """``rsr.num_runbooks: 0``: no planning, review or fresh execution; each verified discovery episode that
  passes the leakage screen is a Q_clean item as it was generated (its prompt is the public one already)."""
  episodes, records, executions = [], [], []
  for t, h, res in discovered:
    screen = screen_trajectory(t, res)
    executions.append({"task": t.name, "harness": h, "episode_id": res.episode_id, "success": res.success,
                       "leakage": list(screen.reasons)})
    if not screen.accepted:
      for reason in screen.reasons:
        counts.add(f"rejected:screen:{reason}", t.family, h)
      continue
    counts.add("leak_screened", t.family, h)
    counts.add("accepted", t.family, h)
    episodes.append(episode_samples(res.segments, len(episodes)))
    records.append({"task": t.name, "family": t.family, "harness": h, "runbook": None, "repeat": 0,
                    "episode_id": res.episode_id})
  log(f"self-imitation (runbook stage off): {len(records)} accepted of {len(discovered)} verified discoveries")
  return finish_funnel(cfg, tasks, counts, f"{label}, runbook stage off (verified self-imitation)", input_digest,
                       {}, workdir, episodes, records, [], executions, outcomes, progress)


def finish_funnel(cfg, tasks, counts, label, input_digest, templates, workdir, episodes, records, runbooks,
            executions, outcomes, progress=None) -> FunnelResult:
  r = cfg.rsr
  manifest = {
      "policy": label, "tasks": len(tasks), "tasks_digest": tasks_digest(tasks), "input_actor_digest": input_digest,
      "settings": _settings(r),
      "templates": {k: {"path": t.path, "version": t.version, "digest": t.digest}
                    for k, t in templates.items() if t is not None},
      "stages": counts.table(counts.total),
      "by_family": {k: counts.table(v) for k, v in sorted(counts.family.items())},
      "by_harness": {k: counts.table(v) for k, v in sorted(counts.harness.items())},
      "empty_reason": None if records else _empty_reason(counts.total, self_imitation=r.num_runbooks == 0),
      # rsr.plan_demonstrations: accepted runbooks, and accepted executions with their private guidance, kept as
      # SFT samples beside the (projected) accepted trajectories
      "plan_demonstrations": sum(rec.get("kind") == "planning" for rec in records),
      "guided_demonstrations": sum(rec.get("kind") == "guided" for rec in records),
  }
  if progress is not None:  # what an interrupted attempt had finished, and what recording it cost
    manifest["progress"] = {"restored": progress.restored, "record_seconds": round(progress.seconds, 3),
                            "funnel_seconds": round(time.time() - progress.t0, 3)}
  if workdir is not None:
    d = epath.Path(workdir)
    d.mkdir(parents=True, exist_ok=True)
    for name, rows in (("runbooks.jsonl", runbooks), ("executions.jsonl", executions), ("q_clean.jsonl", records),
                       ("outcomes.jsonl", outcomes)):
      (d / name).write_text("".join(json.dumps(x) + "\n" for x in rows))
    if episodes:
      save_samples(d / "q_clean.npz", episodes)
    (d / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")  # last: marks the funnel complete
  return FunnelResult(episodes, records, manifest)


def _empty_reason(c: collections.Counter, self_imitation: bool = False) -> str:
  stages = (("discovered", "attempted", "no discovery episode verified"),
            ("planned", "discovered", "no runbook was sampled"),
            ("reviewed", "planned", "no runbook passed review"),
            ("verified", "executed", "no fresh execution verified"),
            ("leak_screened", "verified", "every verified execution failed the leakage screen"))
  if self_imitation:
    stages = (stages[0], ("leak_screened", "discovered", "every verified discovery failed the leakage screen"))
  for stage, prev, what in stages:
    if not c.get(stage):
      return f"{what} ({c.get(prev, 0)} {prev})"
  return "nothing accepted"


def funnel_table(manifest: dict) -> str:
  """The manifest's stage counts as a text table: overall and per discovery harness."""
  hs = list(manifest.get("by_harness", {}))
  rows = [["stage", "all", *hs]]
  for s in STAGES:
    rows.append([s, str(manifest["stages"][s]), *(str(manifest["by_harness"][h][s]) for h in hs)])
  rows.append(["  runbooks rejected", str(manifest["stages"]["review_rejected"]),
               *(str(manifest["by_harness"][h]["review_rejected"]) for h in hs)])
  for reason, n in manifest["stages"]["rejected"].items():
    rows.append([f"  rejected {reason}", str(n),
                 *(str(manifest["by_harness"][h]["rejected"].get(reason, 0)) for h in hs)])
  for kind, n in manifest["stages"]["infra_failures"].items():
    rows.append([f"  infra {kind}", str(n),
                 *(str(manifest["by_harness"][h]["infra_failures"].get(kind, 0)) for h in hs)])
  w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ["  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)) for r in rows]
  if manifest.get("empty_reason"):
    lines.append(f"Q_clean is empty: {manifest['empty_reason']}")
  return "\n".join(lines)


def policy_factory(sampler, seed: int, deterministic: bool, abort: threading.Event | None = None
                   ) -> Callable[[tuple], object]:
  """The actor behind the sampler, one :class:`~rsi_jax.env.rollouts.RolloutPolicy` per episode or call
  (seeded from the tag with ``rollout.deterministic``); ``abort``: one switch that stops them all."""
  from rsi_jax.env.rollouts import RolloutPolicy, derive_seed
  return lambda tag: RolloutPolicy(sampler, abort if abort is not None else threading.Event(),
                                   derive_seed(seed, *tag) if deterministic else None)
