"""``rsr.policy: corpus``: an RSR phase's Q_clean from the stand-in Base's generated corpus (no funnel, no task)."""

from __future__ import annotations

from rsi_jax.policy import FINISH_EOS, SamplingParams
from rsi_jax.rl.batch import episode_samples
from rsi_jax.rsr.funnel import FunnelResult, StageCounts, finish_funnel


CORPUS_LABEL = "the stand-in pre-training corpus (rsi_jax.env.base_corpus; no tasks, no funnel)"


def corpus_label(pairs: int, procedures: int, seed: int) -> str:
  """The manifest's policy for a corpus phase: what it trained on (a stored Q_clean of another corpus is not
  reused)."""
  return f"{CORPUS_LABEL}: {pairs} pairs" + (f", {procedures} procedures" if procedures else "") + f", seed {seed}"


def corpus_funnel(cfg, tokenizer, renderer, *, seed: int, workdir: str | None = None,
                  input_digest: str | None = None) -> FunnelResult:
  """``rsr.policy: corpus``: Q_clean is ``rsr.corpus_pairs`` generated pairs of the stand-in Base's corpus
  (:mod:`rsi_jax.env.base_corpus`, over its own values: never the learning check's), each rendered as the first
  turn of the target harness (its system prompt, the instruction; the reply: the command in the harness's
  convention), recorded token-in/token-out as a harness records a turn; then ``rsr.corpus_procedures``
  two-step procedures, each recorded by the target harness's own loop in a :class:`~rsi_jax.env.base_corpus.
  CorpusShell`. Counted as accepted, by shape."""
  from rsi_jax.env import base_corpus
  from rsi_jax.env.harness import ScriptedPolicy, make_harness, single_turn_segment
  r = cfg.rsr
  seen, _ = base_corpus.value_pools(tokenizer)
  counts, episodes, records = StageCounts(), [], []
  params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens)
  # one harness renders every prompt (procedure_episode gives it each procedure's scripted policy)
  harness = make_harness(r.target_harness, ScriptedPolicy(tokenizer, []), renderer, params, env_cfg=cfg.env)
  for k, (instruction, command) in enumerate(base_corpus.pairs(r.corpus_pairs, seed, seen)):
    shape = base_corpus.SHAPES[k % len(base_corpus.SHAPES)].name
    reply = base_corpus.reply(command, r.target_harness)
    prompt = harness.prompt_for(instruction)
    comp = ScriptedPolicy(tokenizer, [reply]).generate(prompt, params)
    if comp.finish_reason != FINISH_EOS:
      raise ValueError(f"rsr.corpus_pairs: the reply of corpus pair {k} ({shape}) does not fit "
                       f"rollout.max_new_tokens={cfg.rollout.max_new_tokens}: {reply!r}")
    episodes.append(episode_samples([single_turn_segment(prompt, comp)], k))
    records.append({"kind": "corpus", "shape": shape, "harness": r.target_harness, "pair": k})
    counts.add("accepted", f"corpus:{shape}", r.target_harness)
  for k, (instruction, outputs, commands) in enumerate(base_corpus.procedures(r.corpus_procedures, seed, seen)):
    name = base_corpus.PROCEDURES[k % len(base_corpus.PROCEDURES)].name
    run = base_corpus.procedure_episode(harness, tokenizer, instruction, outputs, commands)
    episodes.append(episode_samples(run.segments, len(episodes)))
    records.append({"kind": "corpus", "shape": name, "harness": r.target_harness, "procedure": k,
                    "turns": len(run.turns)})
    counts.add("accepted", f"corpus:{name}", r.target_harness)
  return finish_funnel(cfg, [], counts, corpus_label(r.corpus_pairs, r.corpus_procedures, seed), input_digest,
                       {}, workdir, episodes, records, [], [], [])
