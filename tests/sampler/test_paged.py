"""Paged KV engine: paged attention against a dense loop, chunked prefill against MaxText's prefill and the
actor, and the server's prefix reuse, eviction, admission under a full pool and block accounting."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rsi_jax import policy as P
from rsi_jax.config import ConfigError, load_config
from rsi_jax.sampler.paged import BlockPool, block_hashes, gathered_attention, paged_attention
from rsi_jax.sampler.server import SamplerServer
from tests.sampler.conftest import BLOCK, CHUNK, VOCAB, engine_with
from tests.sampler.test_engine import TOL, reference_logprobs


def dense_attention(q, kp, vp, layer, positions, tables, n_blocks):
  """The same attention, one query row at a time in float64: gather the sequence's blocks in order, keep
  positions <= the row's, softmax per head."""
  s, nq, n_kv, g, d = q.shape
  bs = kp.shape[2]
  out = np.zeros(q.shape)
  for i in range(s):
    if n_blocks[i] == 0:
      continue
    keys = np.concatenate([kp[layer, tables[i, j]] for j in range(n_blocks[i])]).astype(np.float64)
    vals = np.concatenate([vp[layer, tables[i, j]] for j in range(n_blocks[i])]).astype(np.float64)
    for r in range(nq):
      t = min(positions[i, r], n_blocks[i] * bs - 1) + 1
      logits = np.einsum("kgd,tkd->kgt", q[i, r].astype(np.float64), keys[:t])
      w = np.exp(logits - logits.max(-1, keepdims=True))
      out[i, r] = np.einsum("kgt,tkd->kgd", w / w.sum(-1, keepdims=True), vals[:t])
  return out


def _scattered_layout():
  """Sequences of 0, 1, 5 and 3 blocks scattered over a pool of 20 (unused table entries out of range), 3
  query rows each ending inside the last block (decode) or earlier (a chunk's first rows): (q, k pool, v pool,
  positions, tables, n_blocks)."""
  rng = np.random.default_rng(0)
  s, nq, n_kv, g, d, n_pool, bs, width, layers = 4, 3, 2, 2, 8, 20, 4, 6, 2
  kp = rng.normal(size=(layers, n_pool, bs, n_kv, d)).astype(np.float32)
  vp = rng.normal(size=(layers, n_pool, bs, n_kv, d)).astype(np.float32)
  q = rng.normal(size=(s, nq, n_kv, g, d)).astype(np.float32)
  n_blocks = np.array([0, 1, 5, 3], np.int32)
  tables = np.full((s, width), n_pool, np.int32)
  perm = rng.permutation(n_pool)
  used = 0
  for i, n in enumerate(n_blocks):
    tables[i, :n] = perm[used:used + n]
    used += n
  positions = np.stack([np.sort(rng.integers(0, max(n, 1) * bs, nq)) for n in n_blocks]).astype(np.int32)
  positions[:, -1] = np.maximum(n_blocks * bs - 1, 0)
  return q, kp, vp, positions, tables, n_blocks


@pytest.mark.parametrize("work", [1, 3, 16])
def test_paged_attention_matches_a_dense_loop(work):
  """Sequences of 0, 1, 5 and 3 blocks scattered over the pool, several query rows each (causal within a
  prefill chunk); any number of (sequence, block) pairs per iteration gives the same result."""
  q, kp, vp, positions, tables, n_blocks = _scattered_layout()
  got = paged_attention(jnp.asarray(q), jnp.asarray(kp), jnp.asarray(vp), 1, jnp.asarray(positions),
                        jnp.asarray(tables), jnp.asarray(n_blocks), work, jnp.float32)
  np.testing.assert_allclose(np.asarray(got), dense_attention(q, kp, vp, 1, positions, tables, n_blocks),
                             atol=2e-6, rtol=0)
  assert not np.asarray(got)[0].any()  # a sequence with no block reads nothing


@pytest.mark.parametrize("n_read", [5, 6])
def test_gathered_attention_matches_a_dense_loop_and_the_split_k_path(n_read):
  """The gathered path on the same layout as above (sequences of 0, 1, 5 and 3 blocks, unused table entries
  out of range), gathering each sequence's first 5 blocks or one more: equal to the float64 loop and to
  :func:`paged_attention`; a sequence with no block reads nothing."""
  q, kp, vp, positions, tables, n_blocks = _scattered_layout()
  args = (jnp.asarray(q), jnp.asarray(kp), jnp.asarray(vp), 1, jnp.asarray(positions), jnp.asarray(tables),
          jnp.asarray(n_blocks))
  got = np.asarray(gathered_attention(*args, n_read, jnp.float32))
  np.testing.assert_allclose(got, dense_attention(q, kp, vp, 1, positions, tables, n_blocks), atol=2e-6, rtol=0)
  np.testing.assert_allclose(got, np.asarray(paged_attention(*args, 3, jnp.float32)), atol=2e-6, rtol=0)
  assert not got[0].any()


def test_attention_plan_gathers_when_it_reads_at_most_3x_the_blocks_in_use(engine_paged):
  """4 slots, tables of 7 blocks: the gathered path's width is the largest count rounded up to a power of
  two (at most 7); it is chosen unless it would read over 3x the blocks in use or over gather_positions."""
  e = engine_paged
  assert (e.num_slots, e.table_width) == (4, 7)
  assert e.attention_plan([1, 2, 3, 0]) == 4  # 16 blocks read for 6 in use
  assert e.attention_plan([1, 1, 1, 1]) == 1
  assert e.attention_plan([5, 5, 4, 0]) == 7  # rounded to 8, capped at the table
  assert e.attention_plan([7, 1, 0, 0]) == 0  # 28 for 8: the split-K loop
  assert e.attention_plan(None) == 7  # any position of the table
  limit = e.gather_positions
  try:
    e.gather_positions = 4 * 4 * BLOCK - 1
    assert e.attention_plan([1, 2, 3, 0]) == 0 and e.attention_plan([2, 2, 2, 2]) == 2
  finally:
    e.gather_positions = limit


def test_gathered_and_split_k_decode_give_the_same_tokens(engine_paged, actor_params):
  """Four requests of 3..29 prompt tokens decoded to the end of their blocks, once on the gathered path
  (the plan for these short tables) and once on the split-K loop (gathering switched off): the same tokens
  and logprobs within float32 rounding."""
  engine = engine_paged
  params = engine.load_params(actor_params)
  rng = np.random.default_rng(1)
  prompts = [rng.integers(0, VOCAB, n).tolist() for n in (3, 8, 13, 29)]
  tables = np.arange(engine.num_slots * engine.table_width, dtype=np.int32).reshape(engine.num_slots, -1)
  runs = []
  limit = engine.gather_positions
  for gather in (True, False):
    engine.gather_positions = limit if gather else 0
    try:
      assert bool(engine.attention_plan(None)) == gather
      state = engine.init_decode_state()
      for i, p in enumerate(prompts):
        state, _ = engine.prefill_prompt(params, state, p, tables[i], i, jax.random.key(i))
      state, res = engine.generate_steps(params, state, engine.max_cache_length - 30, tables)
      runs.append(jax.device_get((res.tokens, res.logprobs)))
    finally:
      engine.gather_positions = limit
  (tok_g, lp_g), (tok_s, lp_s) = runs
  np.testing.assert_array_equal(tok_g, tok_s)
  np.testing.assert_allclose(lp_g, lp_s, atol=2e-6, rtol=0)
  assert np.mean(lp_g) < -1.0


def test_chunked_prefill_matches_maxtext_prefill_then_decode_matches_the_actor(engine_paged, actor,
                                                                              actor_params):
  """Prompts of 3, 8, 13 and 29 tokens (the last: 4 chunks of 8) written into blocks scattered over the pool:
  the first token and its logprob equal MaxText's whole-prompt prefill (same key), the written keys equal
  MaxText's prefill cache, and every later token's logprob equals the actor's full forward."""
  engine = engine_paged
  assert engine.chunk_size == CHUNK and engine.block_size == BLOCK
  params = engine.load_params(actor_params)
  state = engine.init_decode_state()
  lengths = (3, 8, 13, 29)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, VOCAB, n).tolist() for n in lengths]
  tables = np.full((engine.num_slots, engine.table_width), engine.kv_blocks, np.int32)
  perm = rng.permutation(engine.kv_blocks)
  for i in range(engine.num_slots):  # each slot's whole extent, blocks out of order
    tables[i] = perm[i * engine.table_width:(i + 1) * engine.table_width]
  samplers = [dict(temperature=1.0), dict(temperature=0.0), dict(temperature=0.7, top_k=20),
              dict(temperature=1.0, top_p=0.9)]
  out, lps = [], []
  for i, p in enumerate(prompts):
    state, res = engine.prefill_prompt(params, state, p, tables[i], i, jax.random.key(i), **samplers[i])
    ref = engine.prefill(params, p, jax.random.key(i), **samplers[i])
    assert int(res.token[0]) == int(ref.token[0])
    np.testing.assert_allclose(float(res.logprob[0]), float(ref.logprob[0]), atol=TOL, rtol=0)
    kv = ref.cache["decoder"]["layers"]["self_attention"]["KVCache_0"]["cached_prefill_key"]  # (L, T, K, 1, D)
    mine = np.asarray(state.cache["k"])[:, tables[i, np.arange(len(p)) // BLOCK], np.arange(len(p)) % BLOCK]
    np.testing.assert_allclose(mine, np.asarray(kv)[:, :len(p), :, 0], atol=1e-5, rtol=0)
    out.append([int(res.token[0])])
    lps.append([float(res.logprob[0])])
  limits = [engine.token_limit(n) for n in lengths]
  assert limits == [engine.max_cache_length - n + 1 for n in lengths]
  while any(len(o) < lim for o, lim in zip(out, limits)):
    state, res = engine.generate(params, state, tables)
    for i in range(len(prompts)):
      if len(out[i]) < limits[i]:
        out[i].append(int(res.tokens[i]))
        lps[i].append(float(res.logprobs[i]))
  refs = reference_logprobs(actor, actor_params, prompts, out)
  for i in range(len(prompts)):
    np.testing.assert_allclose(lps[i], refs[i], atol=TOL, rtol=0, err_msg=f"request {i}")
  assert np.mean(np.concatenate(refs)) < -1.0


def conversation(server, episodes, turns, seed, obs_len=5, new_tokens=4):
  """``episodes`` multi-turn episodes served concurrently, each turn's prompt the previous prompt + its
  completion + an observation (as the harness builds them). Returns per episode [(prompt, completion)]."""
  rng = np.random.default_rng(seed)
  prompts = [rng.integers(0, VOCAB, 6 + 3 * e).tolist() for e in range(episodes)]
  out = [[] for _ in range(episodes)]
  for t in range(turns):
    futs = [server.submit(prompts[e], P.SamplingParams(temperature=1.0, max_new_tokens=new_tokens,
                                                       seed=1000 * seed + 10 * e + t)) for e in range(episodes)]
    for e, f in enumerate(futs):
      c = f.result()
      out[e].append((list(prompts[e]), c))
      prompts[e] = prompts[e] + c.token_ids.tolist() + rng.integers(0, VOCAB, obs_len).tolist()
  return out


def reusable(prev_prompt, prev_completion, prompt):
  """Prompt tokens the prefix cache can serve: the previous turn's full blocks (prompt + every generated
  token but the last, whose keys are never written), at most the blocks before the prompt's last token."""
  held = (len(prev_prompt) + len(prev_completion) - 1) // BLOCK
  return min(held, (len(prompt) - 1) // BLOCK) * BLOCK


@pytest.mark.parametrize("kv_blocks", [0, 8], ids=["default_pool", "pressure"])
def test_multi_turn_reuse_equals_serving_each_turn_from_scratch(cfg, actor, actor_params, kv_blocks):
  """Two concurrent 5-turn episodes: with prefix reuse every turn prefills only what the cache does not hold
  and gives the tokens and logprobs of serving it from scratch; under memory pressure (8 blocks: cached
  prefixes are evicted) the results are the same again. After every request, every block is free."""
  sampler = dict(decode_impl="paged", block_size=BLOCK, prefill_chunk=CHUNK, kv_blocks=kv_blocks,
                 max_cache_length=56)
  runs, stats = {}, {}
  for reuse in (True, False):
    engine = engine_with(cfg, **sampler)
    server = SamplerServer(engine, actor_params, eos_token_ids=(), prefix_cache=reuse, decode_steps=2)
    try:
      runs[reuse] = conversation(server, episodes=2, turns=5, seed=3)
    finally:
      server.close()
    server.pool.check_idle()
    stats[reuse] = (server.stats, server.pool)
  for a, b in zip(runs[True], runs[False]):
    for (pa, ca), (pb, cb) in zip(a, b):
      assert pa == pb
      np.testing.assert_array_equal(ca.token_ids, cb.token_ids)
      # Not bitwise: a reused key was computed by a decode step or a chunk of another shape than from scratch
      # (float32 matmuls of different shapes round differently; measured up to 5e-7).
      np.testing.assert_allclose(ca.logprobs, cb.logprobs, atol=2e-6, rtol=0)
  flat = [(p, c.token_ids.tolist()) for ep in runs[True] for p, c in ep]
  total = sum(len(p) for p, _ in flat)
  st, pool = stats[True]
  st0, _ = stats[False]
  assert st0.reused_tokens == 0 and st0.prefill_tokens == total
  assert st.prefill_tokens + st.reused_tokens == total
  if kv_blocks == 0:  # room for everything: every turn after the first reuses all the previous turn left
    expected = sum(reusable(ep[t - 1][0], ep[t - 1][1].token_ids, ep[t][0])
                   for ep in runs[True] for t in range(1, len(ep)))
    assert st.reused_tokens == expected > total / 2
    assert pool.evictions == 0
  else:
    assert pool.evictions > 0
  # The completions are the actor's: the reference over each final sequence.
  pad = flat + flat[:-len(flat) % 4]  # the actor's batch divides over its 4 fsdp devices
  refs = reference_logprobs(actor, actor_params, [p for p, _ in pad], [c for _, c in pad])
  got = [c.logprobs for ep in runs[True] for _, c in ep]
  for g, r in zip(got, refs):
    np.testing.assert_allclose(g, r, atol=TOL, rtol=0)


def test_admission_waits_for_blocks_and_results_do_not_depend_on_it(cfg, actor_params):
  """A pool of 8 blocks holds one request of 30 + 20 tokens (7 blocks) at a time: four such requests on four
  slots are admitted one after another, none fails, and each equals the same request served alone."""
  engine = engine_with(cfg, decode_impl="paged", block_size=BLOCK, prefill_chunk=CHUNK, kv_blocks=8)
  rng = np.random.default_rng(5)
  prompts = [rng.integers(0, VOCAB, 30).tolist() for _ in range(4)]
  sps = [P.SamplingParams(temperature=1.0, max_new_tokens=20, seed=i) for i in range(4)]
  with SamplerServer(engine, actor_params, eos_token_ids=()) as s:
    alone = [s.generate(p, sp) for p, sp in zip(prompts, sps)]
    futs = [s.submit(p, sp) for p, sp in zip(prompts, sps)]
    together = [f.result(timeout=300) for f in futs]
    assert s.stats.busy_slot_steps == s.stats.decode_steps  # never two requests decoding at once
  s.pool.check_idle()
  for a, b in zip(alone, together):
    assert b.finish_reason == P.FINISH_LENGTH and len(b.token_ids) == 20
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6, rtol=0)


def test_a_long_prompt_is_prefilled_between_decode_steps(engine_paged, actor_params):
  """A 48-token prompt (6 chunks) arriving while another request decodes: one chunk per loop turn, each
  followed by a decode call for the running request, which therefore does not wait for the whole prompt."""
  with SamplerServer(engine_paged, actor_params, eos_token_ids=(), decode_steps=1) as s:
    running = s.submit(list(range(1, 6)), P.SamplingParams(max_new_tokens=50, seed=0))
    while s.stats.decode_steps < 2:
      pass
    long = s.submit(list(range(100, 148)), P.SamplingParams(max_new_tokens=2, seed=1)).result(timeout=120)
    assert running.result(timeout=120).finish_reason == P.FINISH_LENGTH and len(long.token_ids) == 2
    assert s.stats.prefill_chunks == 1 + 6
    assert s.stats.interleaved_steps >= 5  # after each of the long prompt's first 5 chunks


def test_prompt_limit_is_max_input_tokens_or_the_sequence_limit(engine_paged, actor_params):
  with SamplerServer(engine_paged, actor_params, max_input_tokens=20, eos_token_ids=()) as s:
    assert s.max_prompt_tokens == 20
    c = s.generate(list(range(21)), P.SamplingParams(max_new_tokens=2))
    assert c.finish_reason == P.FINISH_REJECTED and c.prompt_len == 21 and len(c.token_ids) == 0
    assert len(s.generate(list(range(20)), P.SamplingParams(max_new_tokens=2)).token_ids) == 2
  with SamplerServer(engine_paged, actor_params, prompt_overflow="error") as s:
    assert s.max_prompt_tokens == engine_paged.max_cache_length - 1 == 55
    with pytest.raises(ValueError, match=r"exceeds the limit \(rollout.max_input_tokens / sampler.max_cache_length"
                                         r" - 1\)=55"):
      s.submit(list(range(56)), P.SamplingParams(max_new_tokens=2))
    c = s.generate(list(range(55)), P.SamplingParams(max_new_tokens=5))
    assert c.finish_reason == P.FINISH_CACHE and len(c.token_ids) == 2  # position 55 is the last one


def test_block_pool_lru_eviction_and_accounting():
  pool = BlockPool(3, 2)
  h = block_hashes([1, 2, 3, 4, 5, 6], 2, 3, b"v0")
  assert h == block_hashes([1, 2, 3, 4, 5, 6, 7], 2, 3, b"v0") and h != block_hashes([1, 2, 3, 4, 5, 6], 2, 3, b"v1")
  assert block_hashes([9, 2, 3, 4], 2, 2, b"v0")[1] != h[1]  # a block's hash covers its whole prefix
  a, b = pool.allocate(), pool.allocate()
  pool.register(a, h[0])
  pool.register(b, h[1])
  pool.release(a)
  pool.release(b)
  assert pool.lookup(h) == [a, b] and pool.available() == 3
  c = pool.allocate()  # the free one first
  d = pool.allocate()  # then the least recently used cached block (a): its hash is forgotten
  assert d == a and pool.evictions == 1 and pool.lookup(h) == []
  pool.release(c)
  pool.release(d)
  pool.forget()
  pool.check_idle()
  with pytest.raises(AssertionError, match="released more often"):
    pool.release(c)


def test_pool_config_checks():
  with pytest.raises(ConfigError, match="sampler.kv_blocks"):
    load_config(None, ["sampler.max_cache_length=1024", "sampler.block_size=64", "sampler.kv_blocks=15"])
  huge = load_config(None, ["model.vocab_size=512", "sampler.num_slots=1", "sampler.kv_blocks=2000000000",
                            "sampler.block_size=64"])
  from rsi_jax.sampler.factory import build_engine
  with pytest.raises(ValueError, match=r"sampler.kv_blocks=2000000000 .* lower sampler.kv_blocks"):
    build_engine(huge)


@pytest.mark.slow
def test_tensor_parallel_paged_engine(cfg, actor, actor_params):
  """sampler.num_devices=2: the pool's KV heads split over the tensor axis, same logprobs as the actor."""
  engine = engine_with(cfg, decode_impl="paged", block_size=BLOCK, prefill_chunk=CHUNK, num_devices=2)
  assert engine.mesh.shape["tensor"] == 2
  params = engine.load_params(actor_params)
  prompt = list(range(5, 27))  # 3 chunks
  table = np.arange(engine.table_width, dtype=np.int32) + engine.table_width  # slot 1's blocks
  tables = np.full((engine.num_slots, engine.table_width), engine.kv_blocks, np.int32)
  tables[1] = table
  state, res = engine.prefill_prompt(params, engine.init_decode_state(), prompt, table, 1, jax.random.key(0))
  out, lps = [int(res.token[0])], [float(res.logprob[0])]
  for _ in range(7):
    state, r = engine.generate(params, state, tables)
    out.append(int(r.tokens[1]))
    lps.append(float(r.logprobs[1]))
  np.testing.assert_allclose(lps, reference_logprobs(actor, actor_params, [prompt], [out])[0], atol=TOL, rtol=0)
