"""``rsr.policy: corpus``: an RSR phase's Q_clean from the stand-in Base's generated corpus (no funnel, no task)."""

from __future__ import annotations

import dataclasses

import numpy as np

from rsi_jax.policy import FINISH_EOS, SamplingParams
from rsi_jax.rl.batch import episode_samples
from rsi_jax.rsr.funnel import FunnelResult, StageCounts, finish_funnel, planning_prompt, planning_sample
from rsi_jax.rsr.runbook import Template, load_template, write_runbook


CORPUS_LABEL = "the stand-in pre-training corpus (rsi_jax.env.base_corpus; no tasks, no funnel)"


def corpus_label(r, seed: int) -> str:
  """The manifest's policy for a corpus phase (``r``: its RSR section): what it trained on, down to the corpus's
  own content (:func:`~rsi_jax.env.base_corpus.corpus_digest`), so that a stored Q_clean of another corpus,
  or of this one before its shapes changed, is not reused."""
  from rsi_jax.env.base_corpus import corpus_digest
  return (f"{CORPUS_LABEL}: {r.corpus_pairs} pairs" + (f", {r.corpus_procedures} procedures" if r.corpus_procedures
                                                      else "")
          + (f", {r.corpus_runbooks} runbooks" if r.corpus_runbooks else "")
          + f", seed {seed}, corpus {corpus_digest()}")


def corpus_funnel(cfg, tokenizer, renderer, *, seed: int, workdir: str | None = None,
                  input_digest: str | None = None) -> FunnelResult:
  """``rsr.policy: corpus``: Q_clean is ``rsr.corpus_pairs`` generated pairs of the stand-in Base's corpus
  (:mod:`rsi_jax.env.base_corpus`, over its own values: never the learning check's), each recorded token-in/
  token-out as the target harness records an episode (:func:`command_episode`: its system prompt, the
  instruction, the command in the harness's convention as the reply; under more than one turn, then the
  command's observation and ``done``); then ``rsr.corpus_procedures``
  two-step procedures, each recorded by the target harness's own loop in a :class:`~rsi_jax.env.base_corpus.
  CorpusShell`; then ``rsr.corpus_runbooks`` runbook tasks (:func:`~rsi_jax.env.base_corpus.runbook_tasks`), each
  two samples: the planning call as the funnel makes it (``rsr.plan_template`` over the instruction and its
  commands' transcript) with a runbook of those commands as the reply, and the execution under it (the
  target harness's turns with ``rsr.exec_template``'s private guidance in place of the instruction). Counted
  as accepted, by shape."""
  from rsi_jax.env import base_corpus
  from rsi_jax.env.harness import ScriptedPolicy, make_harness
  r = cfg.rsr
  seen, _ = base_corpus.value_pools(tokenizer)
  counts, episodes, records = StageCounts(), [], []
  params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens)
  # one harness renders every prompt (procedure_episode gives it each procedure's scripted policy)
  harness = make_harness(r.target_harness, ScriptedPolicy(tokenizer, []), renderer, params, env_cfg=cfg.env)
  for k, (instruction, command) in enumerate(base_corpus.pairs(r.corpus_pairs, seed, seen)):
    shape = base_corpus.SHAPES[k % len(base_corpus.SHAPES)].name
    segments = command_episode(harness, tokenizer, instruction, {}, [command], params,
                               f"rsr.corpus_pairs: the reply of corpus pair {k} ({shape})")
    episodes.append(episode_samples(segments, k))
    records.append({"kind": "corpus", "shape": shape, "harness": r.target_harness, "pair": k})
    counts.add("accepted", f"corpus:{shape}", r.target_harness)
  for k, (instruction, outputs, commands) in enumerate(base_corpus.procedures(r.corpus_procedures, seed, seen)):
    name = base_corpus.PROCEDURES[k % len(base_corpus.PROCEDURES)].name
    run = base_corpus.procedure_episode(harness, tokenizer, instruction, outputs, commands)
    episodes.append(episode_samples(run.segments, len(episodes)))
    records.append({"kind": "corpus", "shape": name, "harness": r.target_harness, "procedure": k,
                    "turns": len(run.turns)})
    counts.add("accepted", f"corpus:{name}", r.target_harness)
  templates = (load_template(r.plan_template), load_template(r.exec_template)) if r.corpus_runbooks else ()
  tasks = base_corpus.runbook_tasks(r.corpus_runbooks, seed, seen, procedures=r.corpus_procedures > 0)
  for k, (name, instruction, outputs, commands) in enumerate(tasks):
    plan, guided = runbook_samples(cfg, tokenizer, renderer, templates, instruction, outputs, commands)
    episodes.append([dataclasses.replace(plan, episode=len(episodes))])
    records.append({"kind": "corpus", "shape": name, "harness": r.target_harness, "runbook": k, "stage": "planning"})
    episodes.append(episode_samples(guided, len(episodes)))
    records.append({"kind": "corpus", "shape": name, "harness": r.target_harness, "runbook": k, "stage": "guided"})
    counts.add("accepted", f"corpus:runbook:{name}", r.target_harness, 2)
  return finish_funnel(cfg, [], counts, corpus_label(r, seed), input_digest, dict(zip(("plan", "exec"), templates)),
                       workdir, episodes, records, [], [], [])


def runbook_samples(cfg, tokenizer, renderer, templates: tuple[Template, Template], instruction: str,
                    outputs: dict[str, str], commands: list[str]):
  """A corpus runbook task's two samples: (the planning call -> the runbook of ``commands`` as one
  :class:`~rsi_jax.rl.batch.Sample`, the execution under that runbook as the target harness records it: its
  segments, as :func:`command_episode` records a corpus pair or a procedure)."""
  from rsi_jax.env.harness import ScriptedPolicy, make_harness
  from rsi_jax.rsr.control import Step, render_steps
  r = cfg.rsr
  plan_t, exec_t = templates  # I_plan, I_exec
  transcript = render_steps([Step(c, 0, False, outputs.get(c, "")) for c in commands], r.transcript_output_chars)
  runbook = write_runbook(instruction, commands, "/app").strip()
  plan = planning_sample(planning_prompt(plan_t, instruction, transcript, renderer), runbook, renderer)
  written = int(np.asarray(plan.gen_mask).sum())  # the runbook and <|im_end|>, as the planner must write them
  if written > r.runbook_max_tokens:
    raise ValueError(f"rsr.corpus_runbooks: a runbook of {written} tokens does not fit rsr.runbook_max_tokens="
                     f"{r.runbook_max_tokens}: {runbook!r}")
  params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens)
  guide = lambda task: exec_t.render(instruction=task.instruction.strip(), runbook=runbook)  # noqa: E731
  harness = make_harness(r.target_harness, ScriptedPolicy(tokenizer, []), renderer, params, env_cfg=cfg.env,
                         guidance=guide)
  return plan, command_episode(harness, tokenizer, instruction, outputs, commands, params,
                               "rsr.corpus_runbooks: the guided reply")


def command_episode(harness, tokenizer, instruction: str, outputs: dict[str, str], commands: list[str],
                    params: SamplingParams, what: str):
  """The segments of a corpus task's ``commands`` as ``harness`` records them: a single command under a one-turn
  harness (``env.max_turns: 1``) is its first turn, the whole episode (:func:`first_turn`; ``what`` names the
  reply if it does not fit); otherwise the harness's own loop to ``done`` in a
  :class:`~rsi_jax.env.base_corpus.CorpusShell` (each command, its output as the observation, then ``done``),
  so that a Base for a multi-turn harness learns to end an episode as well as to act."""
  from types import SimpleNamespace

  from rsi_jax.env import base_corpus
  if harness.max_turns == 1 and len(commands) == 1:
    return [first_turn(tokenizer, harness.initial_prompt(SimpleNamespace(instruction=instruction)),
                       base_corpus.reply(commands[0], harness.name), params, what)]
  return base_corpus.procedure_episode(harness, tokenizer, instruction, outputs, commands).segments


def first_turn(tokenizer, prompt: list[int], reply: str, params: SamplingParams, what: str):
  """The segment of one scripted turn, ``prompt`` answered by ``reply``, recorded token-in/token-out as a harness
  records a turn; ``what`` names the reply in the error when it does not fit ``params.max_new_tokens``."""
  from rsi_jax.env.harness import ScriptedPolicy, single_turn_segment
  comp = ScriptedPolicy(tokenizer, [reply]).generate(prompt, params)
  if comp.finish_reason != FINISH_EOS:
    raise ValueError(f"{what} does not fit rollout.max_new_tokens={params.max_new_tokens}: {reply!r}")
  return single_turn_segment(prompt, comp)
