"""The SFT path learns, and this check can fail.

The tiny MaxText Qwen3 of ``configs/smoke.yml`` (``qwen3-tiny``: the real Qwen3 vocabulary, tokenizer and
chat format) is trained from its random init on templated single-turn tasks -- a user instruction such as
"Create notes.txt containing the word apple." -> exactly one action of the ``json`` harness,
``{"command": "echo apple > notes.txt"}`` -- through the code the RSR phase trains with:

* samples: the prompt the chat harness sends (:meth:`ChatRenderer.render` + the generation prompt) and the
  reply as a policy's completion (:class:`~rsi_jax.env.harness.ScriptedPolicy`: its ids + ``<|im_end|>``),
  recorded as one harness :class:`~rsi_jax.env.harness.Turn` -> :func:`~rsi_jax.env.harness.build_segment`
  (gen_mask 1 on the reply and its ``<|im_end|>``, 0 on the prompt) -> :func:`~rsi_jax.rl.batch.episode_samples`;
* data order: :class:`~rsi_jax.rsr.funnel.QClean` (seeded passes, ``rollout.global_batch`` per update,
  ``pipeline.sft_epochs`` passes);
* batch: :func:`~rsi_jax.rl.batch.assemble_batch`; loss: :func:`~rsi_jax.models.optim.masked_nll_loss`
  (Eq. 3 through :func:`~rsi_jax.rl.losses.sft_loss`); update: ``make_optimizer`` / ``make_train_step``;
* evaluation: greedy decoding (temperature 0) through the pipeline's
  :class:`~rsi_jax.sampler.server.SamplerServer` (built once, then hot-swapped like ``RunContext.serve``),
  stopping at ``<|im_end|>``, on held-out instructions whose (template, file, word) combinations never occur in
  training. Every file and every word does occur in training, in every template: only the combination is
  new, so the model has to copy the right prompt tokens into the command, not recall a training reply.

A correct run must reach >= 90 % exact match on the held-out replies. The identical run with the
generated-token mask off by one position must score <= 5 %, although its training loss falls just as far: the
loss alone does not reveal the bug, the held-out check does.

Settings (:data:`LEARNING_RATE` ...), measured on a 2-core CPU (held-out exact match after 105 updates): the
smoke config's learning rate 1e-4 barely moves the random tiny model (tied unit-std embeddings: logit std ~8,
a first loss of ~43 nats per token; after 105 updates 9.4 nats, exact match 0), 1e-3 reaches 0.46, so the run
uses AdamW at a constant 3e-3 with the project's other optimizer settings (b1 0.9, b2 0.98, weight decay 0.1
off norms and biases, global-norm clip 1.0). With 3 seeds (init and data order): 0.83-0.96 after 70 updates,
0.83-1.0 after 84, 0.96-1.0 after 98, 1.0 each after 105 = 5 passes over the 168 training trajectories,
8 per update. Higher rates (5e-3, 1e-2) were no faster; batches of 4 needed about as many trajectories.
Cost: the LM head (64 x 151,936, its logits recomputed in the backward pass, and the log-softmax over them)
is nearly all of a step; like the RSR phase, the step computes it at the generated positions only
(``loss_index``). Rows are kept short: short instructions, no system prompt (a constant prefix that changes
nothing the check is about) and one padded length. The module takes ~1 minute on 2 cores.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from rsi_jax.config import CONFIG_DIR, load_config

pytestmark = pytest.mark.slow

FILES = ("notes", "data", "report", "todo", "config", "backup", "draft", "summary")
WORDS = ("apple", "banana", "cherry", "lemon", "mango", "river", "forest", "silver")
# (instruction, command). Every file and word is one token with its leading space, in the instruction and in
# the command alike, so the command copies ids from the prompt.
TEMPLATES = (
    ("Create {f}.txt containing the word {w}.", "echo {w} > {f}.txt"),
    ("Append the word {w} to {f}.txt.", "echo {w} >> {f}.txt"),
    ("Copy the file {f}.txt to {w}.txt.", "cp {f}.txt {w}.txt"),
)
LEARNING_RATE = 3e-3
BATCH = 8  # trajectories per update (rollout.global_batch)
EPOCHS = 5  # passes over the 168 training trajectories (pipeline.sft_epochs): 105 updates
SEQ_LEN = 32  # every row padded to this (rl.pad_multiple; the longest sample has 32 tokens): one compiled shape
SEED = 0
# The broken run: gen_mask rolled this many positions along time (see test_off_by_one_mask_...).
MASK_SHIFT = -1


def split():
  """(train, held_out) lists of (template, file, word). Held out, per template: one diagonal of the
  file x word grid (every file and every word once), a different diagonal for each template."""
  train, held = [], []
  for t in range(len(TEMPLATES)):
    for i, f in enumerate(FILES):
      for j, w in enumerate(WORDS):
        (held if j == (i + 3 * t + 1) % len(WORDS) else train).append((t, f, w))
  return train, held


def instruction(item) -> str:
  t, f, w = item
  return TEMPLATES[t][0].format(f=f, w=w)


def command(item) -> str:
  t, f, w = item
  return TEMPLATES[t][1].format(f=f, w=w)


def reply(item) -> str:
  """The json harness's action for ``item``: one JSON object."""
  return json.dumps({"command": command(item)})


def pair(item) -> tuple[str, str]:
  """(user instruction, reply): what the check trains on and evaluates."""
  return instruction(item), reply(item)


def prompt_ids(renderer, text: str) -> list[int]:
  """The prompt for one instruction: the user message and the generation prompt."""
  return [int(i) for i in renderer.render([{"role": "user", "content": text}], add_generation_prompt=True).ids]


def episode(tokenizer, renderer, example: tuple[str, str], index: int, prompt=None):
  """One training trajectory from an (instruction, reply) pair, recorded the way the harness records a turn
  (token-in, token-out); ``prompt``: instruction -> prompt ids (default :func:`prompt_ids`)."""
  from rsi_jax.env.harness import ScriptedPolicy, single_turn_segment
  from rsi_jax.policy import SamplingParams
  from rsi_jax.rl.batch import episode_samples
  prompt = prompt_ids(renderer, example[0]) if prompt is None else prompt(example[0])
  comp = ScriptedPolicy(tokenizer, [example[1]]).generate(prompt, SamplingParams(max_new_tokens=128))
  return episode_samples([single_turn_segment(prompt, comp)], index)


def make_config(seq_len: int = SEQ_LEN, batch: int = BATCH, epochs: int = EPOCHS, overrides=()):
  return load_config(CONFIG_DIR / "smoke.yml", [
      "mesh.ici_fsdp_parallelism=1", "mesh.ici_tensor_parallelism=1", f"model.max_target_length={seq_len}",
      f"actor_optim.learning_rate={LEARNING_RATE}", f"rl.pad_multiple={seq_len}",
      f"rl.per_device_token_budget={128 * seq_len}",
      f"rollout.global_batch={batch}", f"rollout.requested={batch}", f"pipeline.sft_epochs={epochs}",
      f"run.seed={SEED}",
      # the sampler: 8 slots (one per test device: MaxText's per-device batch), prompts <= seq_len tokens
      "sampler.num_slots=8", f"sampler.max_prefill_length={seq_len}", f"sampler.prefill_buckets=[{seq_len}]",
      f"sampler.max_cache_length={2 * seq_len}", f"sampler.attention_block={2 * seq_len}", *overrides])


def fit_seq_len(rows, prompts, max_new_tokens: int, multiple: int = 8) -> int:
  """The shortest multiple of ``multiple`` that holds every training row (``rows``: their token counts) and every
  evaluated prompt (``prompts``: make_config's prefill limit is the row), and whose sampler cache (make_config:
  twice the row) holds the longest prompt and ``max_new_tokens``."""
  need = max(*rows, *prompts, -(-(max(prompts) + max_new_tokens) // 2))
  return -(-need // multiple) * multiple


class CompactVocab:
  """The real tokenizer's ids renumbered densely over the ids a check's pairs use (its training and held-out
  prompts and replies, and the special ids), for a model whose output layer has only those rows: the LM head,
  nearly all of an update's cost at the real vocabulary (151,936 rows), shrinks to the check's own. A check of
  what a corpus teaches, not of a model's size: a value the training pairs never hold still has its row (it
  occurs in a held-out prompt), untrained except by the softmax's push-down, as at the full vocabulary.

  Stands in for the tokenizer where the check needs it: ``pad_id``, ``im_end_id``, ``eos_ids`` (the sampler's
  stop ids) and ``decode`` (compact ids -> text through the real tokenizer)."""

  def __init__(self, tokenizer, ids, multiple: int = 128):
    self.tok = tokenizer
    keep = sorted({int(i) for i in ids} | set(tokenizer.eos_ids) | {tokenizer.pad_id, tokenizer.im_end_id})
    self.real = np.asarray(keep, np.int64)
    self.index = {r: k for k, r in enumerate(keep)}
    self.size = -(-len(keep) // multiple) * multiple  # model.vocab_size: rows past the last id never occur
    self.pad_id, self.im_end_id = self.index[tokenizer.pad_id], self.index[tokenizer.im_end_id]
    self.eos_ids = tuple(self.index[i] for i in tokenizer.eos_ids)

  def compact(self, ids) -> np.ndarray:
    return np.asarray([self.index[int(i)] for i in ids], np.int32)

  def decode(self, ids) -> str:
    """Compact ids -> text; a padding row past the last id (the model may emit one) decodes to U+FFFD."""
    ids = [int(i) for i in ids]
    cut = [k for k, i in enumerate(ids) if not 0 <= i < len(self.real)]
    if cut:
      return self.decode(ids[:cut[0]]) + "\ufffd" + self.decode(ids[cut[0] + 1:])
    return self.tok.decode([int(self.real[i]) for i in ids])


class SFTCheck:
  """One tiny actor, one compiled train step and one sampler, shared by the runs. Every run starts from the
  same fresh weights (``run.seed``) and sees the same batches, so two runs differ only in their masks.

  ``train`` / ``held``: (instruction, reply) pairs (default: this module's templates, :func:`split`);
  ``seq_len``: every row padded to it; ``max_new_tokens``: the evaluation's reply limit; ``overrides``: further
  ``key=value`` config overrides (e.g. the model's size); ``prompt``: instruction -> prompt ids, for training
  and evaluation (default: the bare user message, :func:`prompt_ids`); ``compact_also``: further (instruction,
  reply) pairs the check will evaluate; ``seq_len=None``: rows fitted to the training rows and the evaluated
  prompts (:func:`fit_seq_len`); ``compact``: the model's vocabulary is :class:`CompactVocab` over the ids of
  ``train`` and of the evaluated pairs, not the real one."""

  def __init__(self, tokenizer, renderer, train=None, held=None, *, seq_len: int | None = SEQ_LEN, batch: int = BATCH,
               epochs: int = EPOCHS, max_new_tokens: int = 24, overrides=(), prompt=None, compact: bool = False,
               compact_also=()):
    from rsi_jax.models import Actor, build_mesh, make_optimizer, make_train_step, masked_nll_loss
    if train is None:
      train, held = ([pair(it) for it in part] for part in split())
    self.train_pairs, self.held_pairs = list(train), list(held)
    prompt = prompt or (lambda text: prompt_ids(renderer, text))
    self.episodes = [episode(tokenizer, renderer, p, k, prompt) for k, p in enumerate(self.train_pairs)]
    evaluated = [*self.held_pairs, *compact_also]
    if seq_len is None:
      seq_len = fit_seq_len([len(s.ids) for eps in self.episodes for s in eps],
                            [len(prompt(ins)) for ins, _ in evaluated], max_new_tokens)
    self.vocab = None
    if compact:
      used = [i for eps in self.episodes for s in eps for i in s.ids]
      used += [i for ins, rep in evaluated for i in [*prompt(ins), *tokenizer.encode(rep)]]
      self.vocab = v = CompactVocab(tokenizer, used)
      self.episodes = [[dataclasses.replace(s, ids=v.compact(s.ids)) for s in eps] for eps in self.episodes]
      overrides = [f"model.vocab_size={v.size}", *overrides]
      real_prompt = prompt
      prompt = lambda text: [int(i) for i in v.compact(real_prompt(text))]  # noqa: E731
    self.cfg = make_config(seq_len, batch, epochs, overrides)
    self.seq_len, self.batch, self.max_new_tokens = seq_len, batch, max_new_tokens
    self.tok, self.renderer, self.prompt = self.vocab or tokenizer, renderer, prompt
    self.actor = Actor(self.cfg, build_mesh(self.cfg, jax.devices()[:1]))
    self.opt = make_optimizer(self.cfg.actor_optim)
    self.step = make_train_step(self.actor, self.opt, masked_nll_loss(self.actor))
    self.sampler = None

  def close(self):
    if self.sampler is not None:
      self.sampler.close()

  def train(self, mask_shift: int = 0, after_update=None):
    """SFT from the fresh weights; ``mask_shift``: the batch's gen_mask rolled by this many positions along
    time (0: the correct run); ``after_update(n, state, aux)``: called after update ``n`` (1, 2, ...). Returns
    (actor params, nll per generated token of every update)."""
    from rsi_jax.models import init_train_state
    from rsi_jax.models.actor import target_index
    from rsi_jax.rl.batch import assemble_batch
    from rsi_jax.rsr.funnel import QClean
    cfg = self.cfg
    state = init_train_state(self.actor, self.opt, self.actor.init(jax.random.key(cfg.run.seed)))
    order = QClean([{"index": k} for k in range(len(self.episodes))])
    losses = []
    for idx in order.batches(cfg.run.seed, cfg.pipeline.sft_epochs, cfg.rollout.global_batch):
      eps = [self.episodes[int(k)] for k in idx]
      batch = assemble_batch(eps, [1.0] * len(eps), pad_multiple=cfg.rl.pad_multiple, pad_id=self.tok.pad_id,
                             num_rows=cfg.rollout.global_batch)
      assert batch.tokens.shape == (self.batch, self.seq_len), batch.tokens.shape
      mask = batch.gen_mask
      if mask_shift:
        edge = mask[:, -mask_shift:] if mask_shift > 0 else mask[:, :-mask_shift]
        assert not edge.any(), "the shift would wrap a generated token around the row"
        mask = np.roll(mask, mask_shift, axis=1)
      data = {"tokens": batch.tokens, "positions": batch.positions, "segment_ids": batch.segment_ids,
              "mask": mask, "loss_index": target_index(mask)}  # as RSRPhase.step builds it
      state, _, aux = self.step(state, data)
      losses.append(float(aux["nll_per_token"]))
      if after_update is not None:
        after_update(len(losses), state, aux)
    assert int(state.step) == len(losses)
    return state.actor, np.asarray(losses)

  def exact_match(self, params, pairs=None) -> tuple[float, list[str]]:
    """Share of ``pairs`` (default: the held-out ones) whose greedy reply ends with ``<|im_end|>`` and, decoded
    without it, is exactly the expected reply. Also the decoded replies."""
    from rsi_jax import policy as P
    from rsi_jax.sampler.server import SamplerServer
    pairs = self.held_pairs if pairs is None else pairs
    if self.sampler is None:  # the pipeline's sampler (RunContext.serve): built once, then hot-swapped
      self.sampler = SamplerServer.from_config(self.cfg, params, tokenizer=self.tok)
    else:
      self.sampler.update_weights(params)
      assert self.sampler.wait_swapped(timeout=120)
    greedy = P.SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens)
    futs = [self.sampler.submit(self.prompt(ins), greedy) for ins, _ in pairs]
    hits, texts = 0, []
    for (_, expected), f in zip(pairs, futs):
      c = f.result(timeout=300)
      ids = [int(i) for i in c.token_ids]
      ended = c.finish_reason == P.FINISH_EOS and bool(ids) and ids[-1] == self.tok.im_end_id
      text = self.tok.decode(ids[:-1] if ended else ids)
      texts.append(text)
      hits += ended and text == expected
    return hits / len(pairs), texts


@pytest.fixture(scope="module")
def tok_renderer():
  from rsi_jax.models import ChatRenderer, load_tokenizer
  tok = load_tokenizer()
  return tok, ChatRenderer(tok)


@pytest.fixture(scope="module")
def check(tok_renderer):
  c = SFTCheck(*tok_renderer)
  yield c
  c.close()


def test_samples_train_exactly_the_json_action(tok_renderer):
  """The trajectories: the reply is a valid json-harness action, gen_mask covers exactly its ids and
  ``<|im_end|>``, and no held-out combination is among the training ones (while every file and word is)."""
  from rsi_jax.env.actions import parse_json_action
  tok, renderer = tok_renderer
  train, held = split()
  assert len(train) == 168 and len(held) == 24 and not set(train) & set(held)
  for t in range(len(TEMPLATES)):
    assert {f for u, f, _ in train if u == t} == set(FILES) and {w for u, _, w in train if u == t} == set(WORDS)
  for k, item in enumerate(train[:5] + held[:5]):
    (s,) = episode(tok, renderer, pair(item), k)
    assert parse_json_action(reply(item)).command == command(item)
    p = prompt_ids(renderer, instruction(item))
    n = len(p)
    np.testing.assert_array_equal(s.ids[:n], p)
    assert not s.gen_mask[:n].any() and s.gen_mask[n:].all() and len(s.ids) <= SEQ_LEN
    assert tok.decode(s.ids[s.gen_mask]) == reply(item) + "<|im_end|>"
    for name in (item[1], item[2]):  # copied as one and the same id
      (i,) = tok.encode(" " + name)
      assert i in p and i in s.ids[n:]


def test_a_compact_vocabulary_renumbers_the_pairs_ids_and_decodes_them_back(tok_renderer):
  """CompactVocab: dense ids over what a check uses plus the special ids, the real text decoded back, and a
  padding row (never a real id) decoded to U+FFFD, so an output that holds one never equals an expected reply."""
  tok, renderer = tok_renderer
  text = '{"command": "echo apple > notes.txt"}'
  used = prompt_ids(renderer, "Create notes.txt containing the word apple.") + tok.encode(text)
  v = CompactVocab(tok, used)
  assert len(v.real) == len(set(used) | set(tok.eos_ids) | {tok.pad_id}) and v.size % 128 == 0
  assert v.size >= len(v.real) and list(v.real) == sorted(v.real)
  c = v.compact(tok.encode(text))
  assert c.max() < len(v.real) and v.decode(c) == text
  assert v.real[v.im_end_id] == tok.im_end_id and [v.real[i] for i in v.eos_ids] == list(tok.eos_ids)
  assert v.real[v.pad_id] == tok.pad_id
  assert v.decode([*c[:2], v.size - 1, *c[2:]]) == tok.decode(tok.encode(text)[:2]) + "\ufffd" + \
      tok.decode(tok.encode(text)[2:])
  with pytest.raises(KeyError):
    v.compact(tok.encode(" banana"))  # an id no pair used has no row


def test_sft_learns_held_out_json_actions(check):
  """Correct masks: >= 90 % held-out exact match after 105 updates, the loss down by orders of magnitude."""
  params, losses = check.train()
  em, texts = check.exact_match(params)
  misses = [(r, t) for (_, r), t in zip(check.held_pairs, texts) if t != r]
  print(f"correct mask: {len(losses)} updates, nll/token {losses[0]:.3g} -> {losses[-10:].mean():.3g} (last 10), "
        f"held-out exact match {em:.3f}")
  assert len(losses) == 105
  assert losses[0] > 20.0, losses[:5]  # random init: ~42 nats per token
  assert losses[-10:].mean() < 0.05 and losses[0] / losses[-10:].mean() > 400, losses[-10:]
  assert em >= 0.90, (em, misses)


def test_off_by_one_mask_trains_but_fails_held_out(check):
  """The same run with gen_mask shifted one position to the left (``np.roll(gen_mask, -1, axis=1)``): the
  mask marks the position *before* each generated token, i.e. the position that predicts it in a
  next-token-logits convention (logits[t] -> token t+1), while ``Actor.token_logprobs`` puts the log-prob of
  token t at t. The loss then trains the prompt's last token (the generation prompt's closing newlines) and
  every reply token except ``<|im_end|>``: all of them easy, so the loss falls as far as in the correct run,
  but ``<|im_end|>`` is never a target, the model does not learn to end its turn, and no reply ends where
  the action ends: greedy replies are the right action followed by more text. (The other direction, +1,
  never trains the reply's first token, so replies start with an arbitrary token; it scores 0 as well, but
  needs a padded column at the right of the longest row, which the one compiled length does not have.)"""
  params, losses = check.train(MASK_SHIFT)
  em, texts = check.exact_match(params)
  print(f"mask shifted by {MASK_SHIFT}: {len(losses)} updates, nll/token {losses[0]:.3g} -> "
        f"{losses[-10:].mean():.3g} (last 10), held-out exact match {em:.3f}; e.g. {texts[0]!r}")
  assert losses[0] > 20.0 and losses[-10:].mean() < 0.05, (losses[:3], losses[-10:])
  assert em <= 0.05, (em, texts[:4])
