"""SamplerServer: continuous batching, batch-independent outputs, stop conditions, overflow, hot-swap."""

import threading
import time

import numpy as np
import pytest

from rsi_jax import policy as P
from rsi_jax.sampler.server import SamplerServer
from tests.sampler.conftest import AR_CAPACITY, MAX_PREFILL, NUM_SLOTS, VOCAB
from tests.sampler.test_engine import TOL, reference_logprobs


class CharTokenizer:
  """A stand-in tokenizer for the 512-token test vocabulary (the real Qwen3 tokenizer needs the real
  vocabulary): token t decodes to one letter, so stop strings can be placed exactly."""
  eos_token_ids = ()

  def decode(self, ids):
    return "".join(chr(ord("a") + int(t) % 26) for t in ids)


def prompt(n, seed):
  return np.random.default_rng(seed).integers(0, VOCAB, n).tolist()


@pytest.fixture(params=[("engine", 1), ("engine", 3), ("engine_paged", 1), ("engine_paged", 3)],
                ids=["slot-1step", "slot-3steps", "paged-1step", "paged-3steps"])
def server(request, actor_params):
  """Both engines (slot cache, paged pool); outputs must not depend on how many decode steps one engine call
  runs."""
  engine = request.getfixturevalue(request.param[0])
  with SamplerServer(engine, actor_params, tokenizer=CharTokenizer(), eos_token_ids=(),
                     decode_steps=request.param[1]) as s:
    yield s
  if request.param[0] == "engine_paged":
    s.pool.check_idle()  # every request gave its blocks back (cancelled ones included)


def test_alone_equals_joining_a_busy_batch_midway(server, actor, actor_params):
  sp = P.SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=16, seed=1234)
  target = prompt(11, 0)
  alone = server.generate(target, sp)
  start = server.stats.decode_steps
  # Busy: more requests than slots, different lengths; the target arrives while they are decoding.
  others = [server.submit(prompt(3 + 5 * i, 10 + i), P.SamplingParams(max_new_tokens=8 + 3 * i, seed=i))
            for i in range(NUM_SLOTS + 2)]
  while server.stats.decode_steps < start + 3:
    time.sleep(0.005)
  joined = server.submit(target, sp).result()
  np.testing.assert_array_equal(joined.token_ids, alone.token_ids)
  np.testing.assert_allclose(joined.logprobs, alone.logprobs, atol=TOL)
  done = [f.result() for f in others]
  assert [c.finish_reason for c in done] == [P.FINISH_LENGTH] * len(done)
  assert [len(c.token_ids) for c in done] == [8 + 3 * i for i in range(len(done))]
  # Every completion's logprobs are the actor's on its own sequence.
  refs = reference_logprobs(actor, actor_params, [target] + [prompt(3 + 5 * i, 10 + i) for i in range(len(done))],
                            [joined.token_ids] + [c.token_ids for c in done])
  for c, r in zip([joined] + done, refs):
    np.testing.assert_allclose(c.logprobs, r, atol=TOL)
  assert server.stats.busy_slot_steps > server.stats.decode_steps  # steps were shared


def test_many_threads_share_the_engine(server):
  results = {}

  def worker(i):
    results[i] = server.generate(prompt(4 + i, 100 + i), P.SamplingParams(max_new_tokens=5 + i, seed=i))

  threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert sorted(results) == list(range(8))
  assert all(len(results[i].token_ids) == 5 + i and results[i].prompt_len == 4 + i for i in range(8))
  assert isinstance(server, P.Policy)


def test_stop_conditions(server):
  greedy = P.SamplingParams(temperature=0.0, max_new_tokens=12)
  p = prompt(6, 1)
  ref = server.generate(p, greedy)
  assert ref.finish_reason == P.FINISH_LENGTH and len(ref.token_ids) == 12
  # EOS / stop token: the first occurrence of ref's 4th token ends it, token included.
  stop_tok = int(ref.token_ids[3])
  k = list(ref.token_ids).index(stop_tok)
  c = server.generate(p, P.SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(stop_tok,)))
  assert c.finish_reason == P.FINISH_EOS
  np.testing.assert_array_equal(c.token_ids, ref.token_ids[:k + 1])
  # Stop string: the decoded text of tokens 2..4 (one letter each here).
  text = CharTokenizer().decode(ref.token_ids)
  s = text[2:5]
  end = text.index(s) + len(s)
  c = server.generate(p, P.SamplingParams(temperature=0.0, max_new_tokens=12, stop_strings=(s,)))
  assert c.finish_reason == P.FINISH_STOP
  np.testing.assert_array_equal(c.token_ids, ref.token_ids[:end])
  # Max new tokens 1, or a stop id drawn by the prefill: done on the prefill's token, and the slot it held
  # for one call is free again (more requests than slots all complete).
  c = server.generate(p, P.SamplingParams(temperature=0.0, max_new_tokens=1))
  assert c.finish_reason == P.FINISH_LENGTH and list(c.token_ids) == [ref.token_ids[0]]
  first_stop = P.SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(int(ref.token_ids[0]),))
  outs = [f.result() for f in [server.submit(p, first_stop) for _ in range(2 * NUM_SLOTS + 1)]]
  assert all(o.finish_reason == P.FINISH_EOS and list(o.token_ids) == [ref.token_ids[0]] for o in outs)
  # Cache full: a slot holds max_cache_length positions, prompt included, and the last token is not cached.
  c = server.generate(p, P.SamplingParams(temperature=0.0, max_new_tokens=1000))
  assert c.finish_reason == P.FINISH_CACHE and len(c.token_ids) == MAX_PREFILL + AR_CAPACITY - len(p) + 1
  np.testing.assert_array_equal(c.token_ids[:12], ref.token_ids)


def test_prompt_overflow_policies(engine, actor_params):
  long = prompt(MAX_PREFILL + 5, 2)
  sp = P.SamplingParams(temperature=0.0, max_new_tokens=4)
  with SamplerServer(engine, actor_params, prompt_overflow="reject") as s:
    c = s.generate(long, sp)
    assert c.finish_reason == P.FINISH_REJECTED and len(c.token_ids) == 0 and c.prompt_len == len(long)
    assert s.max_prompt_tokens == MAX_PREFILL  # what the harness sizes summarization by
  with SamplerServer(engine, actor_params, prompt_overflow="error") as s:
    with pytest.raises(ValueError, match="max_prefill_length"):
      s.submit(long, sp)
  with SamplerServer(engine, actor_params, prompt_overflow="truncate_left") as s:
    c = s.generate(long, sp)
    tail = s.generate(long[-MAX_PREFILL:], sp)
    assert c.prompt_len == MAX_PREFILL and s.max_prompt_tokens is None
    np.testing.assert_array_equal(c.token_ids, tail.token_ids)
    with pytest.raises(ValueError):
      s.submit([VOCAB], sp)


@pytest.mark.parametrize("impl", ["engine", "engine_paged"])
@pytest.mark.parametrize("policy", ["finish_on_old", "mark"])
def test_weight_swap(impl, request, actor, actor_params, actor_params_b, policy):
  """(Paged: the prompt's keys cached under the old weights are not reused after the swap.)"""
  engine = request.getfixturevalue(impl)
  sp_long = P.SamplingParams(temperature=1.0, max_new_tokens=AR_CAPACITY, seed=5)
  sp = P.SamplingParams(temperature=1.0, max_new_tokens=10, seed=6)
  p = prompt(9, 3)
  new = engine.load_params(actor_params_b)  # training mesh -> sampling mesh, ahead so the swap below is quick
  with SamplerServer(engine, actor_params, swap_policy=policy, eos_token_ids=()) as s:
    before = s.generate(p, sp)
    start = s.stats.decode_steps
    inflight = s.submit(p, sp_long)
    while s.stats.decode_steps < start + 4:  # the long request is decoding (about 20 steps to go)
      time.sleep(0.001)
    v = s.update_weights(new)
    after = s.submit(p, sp).result()
    old = inflight.result()
  assert v == 1 and before.weight_version == 0 and after.weight_version == 1 and not after.version_changed
  assert len(old.token_ids) == AR_CAPACITY  # not dropped
  assert not np.array_equal(before.token_ids, after.token_ids)
  ref_b = reference_logprobs(actor, actor_params_b, [p], [after.token_ids])[0]
  np.testing.assert_allclose(after.logprobs, ref_b, atol=TOL)
  ref_old = reference_logprobs(actor, actor_params, [p], [old.token_ids])[0]
  if policy == "finish_on_old":
    assert old.weight_version == 0 and not old.version_changed
    np.testing.assert_allclose(old.logprobs, ref_old, atol=TOL)
  else:
    # Tokens before the swap are the old actor's; after it the new weights decode over a cache the old
    # ones wrote, which is neither actor's full forward: hence the mark.
    assert old.weight_version == 1 and old.version_changed
    np.testing.assert_allclose(old.logprobs[:4], ref_old[:4], atol=TOL)
    assert not np.allclose(old.logprobs, ref_old, atol=TOL)


def test_stop_string_window_with_the_qwen3_tokenizer():
  """Fed one token at a time, the tail-window check fires exactly at the token that completes the string."""
  from rsi_jax.models.tokenizer import load_tokenizer
  from rsi_jax.sampler.request import stop_string_hit
  tok = load_tokenizer()
  ids = tok.encode("Running tests...\nAll 12 passed. DONE_MARKER\nbye")
  for stop in ("DONE_MARKER", "passed.", "\nbye", "ü"):
    text = tok.decode(ids)
    hits = [k for k in range(1, len(ids) + 1) if stop_string_hit(tok, ids[:k], (stop,))]
    if stop not in text:
      assert hits == []
      continue
    first = next(k for k in range(1, len(ids) + 1) if stop in tok.decode(ids[:k]))
    assert hits and hits[0] == first


def in_flight(server) -> int:
  """Requests queued or holding a slot."""
  with server._cv:
    return len(server._queue) + sum(r is not None and not r.done for r in server._slots)


def test_close_fails_requests_in_flight(engine, actor_params):
  s = SamplerServer(engine, actor_params, eos_token_ids=())
  futures = [s.submit(prompt(5, i), P.SamplingParams(max_new_tokens=AR_CAPACITY)) for i in range(NUM_SLOTS + 2)]
  s.close()
  errors = [f.exception() for f in futures]  # every future is resolved once close() returns
  assert any(e is not None for e in errors)  # at least the queued ones never ran
  assert all(e is None or isinstance(e, RuntimeError) for e in errors)
  with pytest.raises(RuntimeError, match="closed"):
    s.submit([1, 2], P.SamplingParams())


def test_cancel_frees_queued_and_running_requests(server, actor_params):
  """An aborted episode's request: queued ones are dropped, running ones give their slot back at the next
  step; their futures are cancelled, the others complete as if nothing happened."""
  from concurrent.futures import CancelledError
  long = P.SamplingParams(max_new_tokens=10_000, seed=3)  # ends when the slot's cache is full
  ref = server.generate(prompt(5, 99), P.SamplingParams(max_new_tokens=6, seed=7))
  p0 = server.stats.prefills
  running = [server.submit(prompt(4 + i, 50 + i), long) for i in range(NUM_SLOTS)]
  queued = [server.submit(prompt(6, 70 + i), long) for i in range(2)]
  while server.stats.prefills < p0 + NUM_SLOTS:
    time.sleep(0.0005)
  with server._cv:  # the loop pauses at its next turn
    assert not running[1].done() and not queued[0].done() and in_flight(server) == NUM_SLOTS + 2
    assert server.cancel(queued[0]) and server.cancel(running[1])
  with pytest.raises(CancelledError):
    queued[0].result()
  with pytest.raises(CancelledError):
    running[1].result()
  again = server.submit(prompt(5, 99), P.SamplingParams(max_new_tokens=6, seed=7)).result(timeout=60)
  np.testing.assert_array_equal(again.token_ids, ref.token_ids)  # served in a freed slot, unaffected
  rest = [f.result(timeout=60) for f in running[:1] + running[2:] + queued[1:]]
  assert all(c.finish_reason == P.FINISH_CACHE for c in rest)
  assert not server.cancel(running[0])  # already finished
  assert server.stats.cancelled == 2 and in_flight(server) == 0
