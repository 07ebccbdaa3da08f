"""Does the stand-in Base's corpus (rsi_jax.env.base_corpus) teach copying? Trains the tiny model from its random
init on N corpus pairs (the SFT learning check's harness: tests/rl/test_sft_learning.py's ``SFTCheck``, the RSR
phase's samples, batches, loss and update) and prints, every K updates, greedy exact match on pairs whose values
the corpus never holds (``unseen``) and on new pairs over the corpus's own values (``seen, new pairs``); at the
end, exact match on unseen values by shape (where copying fails).

Usage: .venv/bin/python scripts/base_corpus_check.py [--pairs 6000] [--batch 16] [--epochs 1] [--every 75]
       [--eval 68] [--by-shape 10] [--prompt bare|harness] [--broken] [--compact]
       [--shapes NAME,NAME,...] [--seq-len T] [--cosine [--warmup N]]
       [--checkpoint DIR [--runbooks N] [--multi-turn N]] [--config CHECK] [key=value ...]
       (key=value: config overrides, e.g. model.base_emb_dim=128)

``--prompt harness``: every pair as the learning check's json-harness first turn (its system prompt), as the
training program's corpus phase (``rsr.policy: corpus``, configs/stand_in_base.yml) trains on it.
``--checkpoint DIR``: measure a Base that program made, instead of training one here. ``--runbooks N``: also the
runbook format (``rsr.corpus_runbooks``) on N runbook tasks over unseen values (always under the harness prompt,
as the funnel asks): greedy exact match of the runbook written from the planning call (I_plan over the instruction
and the commands' transcript) against the runbook of those commands, and of the first reply when the task's own
runbook is the private guidance (I_exec) against its first command. ``--multi-turn N``: also N procedures and N
pairs over unseen values recorded as whole episodes (the multi-step stand-in Base's corpus, configs/
stand_in_base_multi.yml): greedy exact match of the reply after each observation -- a procedure's second command,
whose value only the first command's output gives; ``done`` after its last command; ``done`` after a pair's one
command. ``--config``: the check whose harness gives the prompts (default configs/learn_check.yml; the
multi-step Base: configs/learn_check_multi.yml, four turns, which ``--multi-turn`` needs).

``--compact``: the model's vocabulary is only the ids the pairs use, training and evaluated
(tests/rl/test_sft_learning.py's ``CompactVocab``): the output layer, nearly all of an update's cost at the real
vocabulary, shrinks ~8x. It measures what the corpus teaches at a smaller cost, not a Base the program can use.

``--cosine``: the learning rate warms up over ``--warmup`` updates (default 50) and decays on a cosine to 1%
at the run's last update (``actor_optim.schedule: cosine``, ``decay_steps`` the run's updates), instead of
staying constant: copying then settles where the constant rate keeps moving it (README, learning check).

``--broken``: the corpus's broken variant (each command's values drawn afresh, not copied), which must not
teach copying. Writes nothing; the figures go into the issue note.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

import numpy as np
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--pairs", type=int, default=6000)
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--epochs", type=int, default=1)
  ap.add_argument("--every", type=int, default=75)
  ap.add_argument("--eval", type=int, default=68, help="evaluation pairs per kind")
  ap.add_argument("--broken", action="store_true")
  ap.add_argument("--compact", action="store_true", help="the model's vocabulary: the ids the pairs use")
  ap.add_argument("--shapes", help="comma-separated shape names: the corpus and its measures over these only "
                                   "(default: every shape)")
  ap.add_argument("--by-shape", type=int, default=10, metavar="N",
                  help="at the end, exact match on N unseen-value pairs per shape (0: not)")
  ap.add_argument("--prompt", choices=("harness", "bare"), default="bare",
                  help="harness: each instruction as the json harness's first turn (its system prompt), as the "
                       "training program's corpus phase (rsr.policy corpus) renders it; bare: the user message "
                       "alone")
  ap.add_argument("--checkpoint", metavar="DIR",
                  help="measure this Base checkpoint (or phase folder: its newest step) instead of training one; "
                       "give its model as key=value (e.g. model_name=qwen3-tiny-8x128)")
  ap.add_argument("--seq-len", type=int, metavar="T",
                  help="every training row padded to T tokens (default: the longest training row or evaluated "
                       "prompt, rounded up to 8, with room for the reply in the sampler's cache)")
  ap.add_argument("--cosine", action="store_true",
                  help="warm the learning rate up over --warmup updates, then decay it on a cosine to 1%% at the "
                       "last update")
  ap.add_argument("--warmup", type=int, metavar="N", help="--cosine's warmup in updates (default 50)")
  ap.add_argument("--runbooks", type=int, default=0, metavar="N",
                  help="with --checkpoint: also measure writing and following runbooks on N unseen-value tasks")
  ap.add_argument("--multi-turn", type=int, default=0, metavar="N",
                  help="with --checkpoint: the replies after an observation, on N procedures and N pairs")
  ap.add_argument("--config", default="configs/learn_check.yml",
                  help="the learning check whose harness renders the prompts (--prompt harness, --runbooks, "
                       "--multi-turn)")
  ap.add_argument("overrides", nargs="*")
  a = ap.parse_args(argv)
  if a.warmup is not None and not a.cosine:
    ap.error("--warmup is --cosine's warmup; give --cosine with it")
  for flag, n in (("--runbooks", a.runbooks), ("--multi-turn", a.multi_turn)):
    if n and not a.checkpoint:
      ap.error(f"{flag} measures a --checkpoint (a Base the training program made)")
  if a.checkpoint and (a.compact or a.cosine):
    ap.error(f"{'--compact' if a.compact else '--cosine'} trains a model of its own; it cannot measure a "
             f"--checkpoint")
  from rsi_jax.config import REPO_ROOT, load_config
  from rsi_jax.env import base_corpus as bc
  from rsi_jax.models import ChatRenderer, load_tokenizer
  from tests.rl.test_sft_learning import SFTCheck, prompt_ids

  tok = load_tokenizer()
  seen, unseen = bc.value_pools(tok)
  by_name = {s.name: s for s in bc.SHAPES}
  names = a.shapes.split(",") if a.shapes else list(by_name)
  if unknown := [n for n in names if n not in by_name]:
    ap.error(f"--shapes: no shape {', '.join(unknown)} (shapes: {', '.join(by_name)})")
  shapes = tuple(by_name[n] for n in names)
  as_reply = lambda ps: [(i, bc.reply(c)) for i, c in ps]  # noqa: E731
  train = as_reply(bc.pairs(0 if a.checkpoint else a.pairs, 0, seen, broken=a.broken, shapes=shapes))
  held = {"unseen": as_reply(bc.pairs(a.eval, 1, unseen, shapes=shapes)),
          "seen, new pairs": as_reply(bc.pairs(a.eval, 2, seen, shapes=shapes))}
  probe = as_reply(bc.pairs(a.by_shape * len(shapes), 4, unseen, shapes=shapes))  # unseen values, by shape
  print(f"corpus: {0 if a.checkpoint else a.pairs} pairs over {len(seen)} values, {len(shapes)} shapes"
        f"{' (broken: values not copied)' if a.broken else ''}; {len(unseen)} values kept out", flush=True)
  # the learning check's SFT optimizer (configs/learn_check.yml: no weight decay, which would shrink the tied
  # embeddings of the values the corpus never holds, and so their logits, at every update)
  renderer, prompt = ChatRenderer(tok), None
  cfg = load_config(REPO_ROOT / a.config)
  from rsi_jax.env.harness import ScriptedPolicy, make_harness
  harness = make_harness("json", ScriptedPolicy(tok, []), renderer, env_cfg=cfg.env)  # --config's json harness
  if a.prompt == "harness":  # (configs/learn_check.yml: one turn, 20 s)
    prompt = harness.prompt_for
  if a.multi_turn and cfg.env.max_turns < 3:
    ap.error(f"--multi-turn: {a.config} has env.max_turns {cfg.env.max_turns}; a procedure is read, act, done "
             f"(configs/learn_check_multi.yml has four)")
  runbooks, turns, keyed, max_new = {}, {}, {}, 48  # keyed: SFTCheck's prompt function maps a key to its ids
  if a.runbooks:  # the planning and guided prompts exactly as the corpus phase makes them
    from rsi_jax.rsr.corpus import runbook_samples
    from rsi_jax.rsr.runbook import load_template
    templates = (load_template(cfg.rsr.plan_template), load_template(cfg.rsr.exec_template))
    runbooks = {"written": [], "followed": []}
    for k, (_, instruction, outputs, commands) in enumerate(bc.runbook_tasks(a.runbooks, 5, unseen)):
      plan, (guided, *_) = runbook_samples(cfg, tok, renderer, templates, instruction, outputs, commands)
      gen = np.asarray(plan.gen_mask) > 0
      keyed[f"written {k}"] = [int(i) for i in plan.ids[~gen]]
      runbooks["written"].append((f"written {k}", tok.decode([int(i) for i in plan.ids[gen]][:-1])))
      first = int(np.argmax(np.asarray(guided.gen_mask) > 0))
      keyed[f"followed {k}"] = [int(i) for i in guided.ids[:first]]
      runbooks["followed"].append((f"followed {k}", bc.reply(commands[0])))
    max_new = max(48, max(len(tok.encode(r)) for _, r in runbooks["written"]) + 16)
  if a.multi_turn:  # each reply that follows an observation, its prompt the episode up to it (as recorded)
    from rsi_jax.rsr.corpus import command_episode
    from rsi_jax.rl.batch import episode_samples
    from rsi_jax.policy import SamplingParams
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens)
    turns = {"procedures, the act from the output": [], "procedures, done after it": [],
             "pairs, done after the command": []}
    episodes = [("procedures", i, o, c) for i, o, c in bc.procedures(a.multi_turn, 6, unseen)]
    episodes += [("pairs", i, {}, [c]) for i, c in bc.pairs(a.multi_turn, 7, unseen, shapes=shapes)]
    for k, (kind, instruction, outputs, commands) in enumerate(episodes):
      (s,) = episode_samples(command_episode(harness, tok, instruction, outputs, commands, params, kind), 0)
      gen = np.asarray(s.gen_mask) > 0
      edges = np.flatnonzero(np.diff(np.concatenate([[0], gen.astype(int), [0]])))  # each reply's [start, end)
      recorded = [tok.decode([int(i) for i in s.ids[b:e - 1]]) for b, e in zip(edges[::2], edges[1::2])]
      wants = [bc.reply(c) for c in commands] + [bc.done_reply()]
      assert recorded == wants, (recorded, wants)  # the replies the episode holds, less each <|im_end|>
      names = (["procedures, the act from the output"] * (len(commands) - 1)
               + [f"{kind}, done after {'it' if kind == 'procedures' else 'the command'}"])
      for j, (start, want, name) in enumerate(zip(edges[2::2], wants[1:], names)):  # the replies after the first
        keyed[f"turn {k}.{j}"] = [int(i) for i in s.ids[:start]]
        turns[name].append((f"turn {k}.{j}", want))
  if keyed:
    plain = prompt or (lambda text: prompt_ids(renderer, text))
    prompt = lambda key: keyed[key] if key in keyed else plain(key)  # noqa: E731
  schedule = []
  if a.cosine:
    warmup = 50 if a.warmup is None else a.warmup
    from rsi_jax.rsr.funnel import QClean
    updates = len(QClean([{}] * len(train)).batches(0, a.epochs, a.batch))  # the updates SFTCheck.train makes
    if updates <= warmup:
      ap.error(f"--cosine: the run has {updates} updates, not more than its warmup of {warmup}")
    schedule = ["actor_optim.schedule=cosine", f"actor_optim.warmup_steps={warmup}",
                f"actor_optim.decay_steps={updates}"]
    print(f"learning rate: warmup {warmup}, cosine to 1% at update {updates}", flush=True)
  check = SFTCheck(tok, renderer, train, held["unseen"], seq_len=a.seq_len, batch=a.batch, epochs=a.epochs,
                   max_new_tokens=max_new, overrides=["actor_optim.weight_decay=0.0", *schedule, *a.overrides],
                   prompt=prompt,
                   compact=a.compact, compact_also=[*held["seen, new pairs"], *probe,
                                                    *[p for v in runbooks.values() for p in v]])
  print(f"rows of {check.seq_len} tokens", flush=True)
  if check.vocab:
    print(f"compact vocabulary: {check.vocab.size} ids (of {tok.vocab_size})", flush=True)
  t0 = time.time()

  def report(n, state, aux):
    if n % a.every:
      return
    train_s = time.time() - t0
    scores = {k: check.exact_match(state.actor, v) for k, v in held.items()}
    print(f"update {n} ({train_s:.0f} s): nll/token {float(aux['nll_per_token']):.3f}; "
          + "; ".join(f"{k} {em:.3f}" for k, (em, _) in scores.items()), flush=True)
    _, texts = scores["unseen"]
    for (_, want), got in [(p, t) for p, t in zip(held["unseen"], texts) if p[1] != t][:2]:
      print(f"  want {want}\n  got  {got}", flush=True)

  try:
    if a.checkpoint:  # a Base the training program made (configs/stand_in_base.yml): measured, not trained
      from rsi_jax.models.checkpoint import resolve_checkpoint, restore_params
      params = restore_params(resolve_checkpoint(a.checkpoint), actor=check.actor.abstract_params)["actor"]
      scores = {k: check.exact_match(params, v)[0] for k, v in held.items()}
      print(f"{a.checkpoint}: " + "; ".join(f"{k} {em:.3f}" for k, em in scores.items()), flush=True)
      for kind, pairs in runbooks.items():
        em, texts = check.exact_match(params, pairs)
        print(f"runbooks {kind} ({len(pairs)} tasks over unseen values): {em:.3f}", flush=True)
        for (_, want), got in [(p, t) for p, t in zip(pairs, texts) if p[1] != t][:1]:
          print(f"  want {want!r}\n  got  {got!r}", flush=True)
      for kind, pairs in turns.items():
        em, texts = check.exact_match(params, pairs)
        print(f"multi-turn: {kind} ({len(pairs)} over unseen values): {em:.3f}", flush=True)
        for (_, want), got in [(p, t) for p, t in zip(pairs, texts) if p[1] != t][:1]:
          print(f"  want {want!r}\n  got  {got!r}", flush=True)
    else:
      params, _ = check.train(after_update=report)
    if a.by_shape:  # where copying fails: unseen values, by shape (pairs take the shapes in turn)
      _, texts = check.exact_match(params, probe)
      hits, misses = collections.Counter(), collections.defaultdict(list)
      for k, ((_, want), got) in enumerate(zip(probe, texts)):
        name = shapes[k % len(shapes)].name
        hits[name] += want == got
        misses[name] += [] if want == got else [(want, got)]
      order = sorted(shapes, key=lambda s: hits[s.name])
      print(f"unseen, by shape ({a.by_shape} pairs each; {sum(hits.values()) / len(probe):.3f} in all): "
            + ", ".join(f"{s.name} {hits[s.name]}" for s in order), flush=True)
      for s in [s for s in order if misses[s.name]][:6]:  # the worst shapes' first miss
        want, got = misses[s.name][0]
        print(f"  {s.name}: want {want}\n  {' ' * len(s.name)}  got  {got}", flush=True)
  finally:
    check.close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
