"""Engine: prefill -> insert -> generate reproduces the actor's full-forward logprobs, slot by slot."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.sampler.conftest import AR_CAPACITY, MAX_PREFILL, VOCAB, engine_with

TOL = 2e-5  # float32: |sampler logprob - Actor.token_logprobs| on the same sequence


def reference_logprobs(actor, params, prompts, completions):
  """Actor.token_logprobs of each completion token given its prompt, one padded batch (pad = segment 0)."""
  seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
  t = max(map(len, seqs))
  tokens = np.zeros((len(seqs), t), np.int32)
  seg = np.zeros((len(seqs), t), np.int32)
  for i, s in enumerate(seqs):
    tokens[i, :len(s)] = s
    seg[i, :len(s)] = 1
  pos = np.broadcast_to(np.arange(t, dtype=np.int32), tokens.shape)
  lp = np.asarray(actor.token_logprobs(params, jnp.asarray(tokens), jnp.asarray(pos), jnp.asarray(seg)))
  return [lp[i, len(p):len(p) + len(c)] for i, (p, c) in enumerate(zip(prompts, completions))]


@pytest.fixture(scope="module")
def engine_block16(cfg):
  """Slot decode reading the cache in blocks of 16 positions (56 -> 4 blocks, the last one partly unused)."""
  return engine_with(cfg, decode_impl="slot", attention_block=16)


@pytest.mark.parametrize("impl", ["slot", "slot_block16", "maxtext"])
def test_mixed_lengths_staggered_match_actor_logprobs(impl, request, actor, actor_params):
  """Four prompts of different lengths (all three buckets), inserted at different decode steps, each decoded
  until its slot's cache is full; every sampled token's logprob equals the actor's full forward."""
  engine = request.getfixturevalue({"slot": "engine", "slot_block16": "engine_block16",
                                    "maxtext": "engine_maxtext"}[impl])
  if impl == "slot_block16":
    assert engine.attention_block == 16 and engine._slot_shape[2] == 64
  params = engine.load_params(actor_params)  # training mesh (8 devices, fsdp) -> sampling mesh
  rng = np.random.default_rng(0)
  lengths = (3, 8, 13, 29)
  prompts = [rng.integers(0, VOCAB, n).tolist() for n in lengths]
  limits = [engine.token_limit(n) for n in lengths]
  if impl != "maxtext":  # a slot holds max_cache_length positions, prompt included
    assert limits == [MAX_PREFILL + AR_CAPACITY - n + 1 for n in lengths]
  else:  # MaxText's ring: AR_CAPACITY generated entries whatever the prompt
    assert limits == [AR_CAPACITY + 1] * 4
  samplers = [dict(temperature=1.0), dict(temperature=0.0), dict(temperature=0.7, top_k=20),
              dict(temperature=1.0, top_p=0.9)]
  state = engine.init_decode_state()
  out = [[] for _ in prompts]
  lps = [[] for _ in prompts]
  join_at = (0, 0, 5, 11)  # decode step before which each request is inserted
  for step in range(max(j + n for j, n in zip(join_at, limits))):
    for i, j in enumerate(join_at):
      if j == step:
        pre = engine.prefill(params, prompts[i], jax.random.key(i), **samplers[i])
        state = engine.insert(pre, state, i)
        out[i].append(int(pre.token[0]))
        lps[i].append(float(pre.logprob[0]))
    state, res = engine.generate(params, state)
    tok, lp, act = map(np.asarray, (res.tokens, res.logprobs, res.active))
    for i, j in enumerate(join_at):
      if act[i] and len(out[i]) < limits[i]:
        out[i].append(int(tok[i]))
        lps[i].append(float(lp[i]))
  assert [len(o) for o in out] == limits
  refs = reference_logprobs(actor, actor_params, prompts, out)
  for i in range(len(prompts)):
    np.testing.assert_allclose(lps[i], refs[i], atol=TOL, rtol=0, err_msg=f"request {i}")
  assert np.mean(np.concatenate(refs)) < -1.0  # a spread-out model: the check is not trivially 0 == 0
  # Greedy slot: every token is the argmax of the actor's logits.
  full = list(prompts[1]) + out[1]
  logits = np.asarray(actor.logits(actor_params, jnp.asarray([full]), jnp.arange(len(full))[None],
                                   jnp.ones((1, len(full)), jnp.int32)))[0]
  np.testing.assert_array_equal(np.argmax(logits[len(prompts[1]) - 1:-1], -1), out[1])


def test_generate_steps_equals_single_steps(engine, actor_params):
  """n steps in one call give the same tokens, logprobs and state as n calls of generate."""
  params = engine.load_params(actor_params)

  def start():
    state = engine.init_decode_state()
    for slot, (n, temp) in enumerate(((5, 1.0), (17, 0.0), (9, 0.8))):
      state = engine.insert(engine.prefill(params, list(range(3, 3 + n)), jax.random.key(slot),
                                           temperature=temp), state, slot)
    return state

  state, singles = start(), []
  for _ in range(6):
    state, res = engine.generate(params, state)
    singles.append(res)
  one_pos = np.asarray(state.next_pos)
  state, multi = engine.generate_steps(params, start(), 6)
  assert multi.tokens.shape == (6, engine.num_slots)
  np.testing.assert_array_equal(np.asarray(multi.tokens), np.stack([np.asarray(r.tokens) for r in singles]))
  np.testing.assert_allclose(np.asarray(multi.logprobs), np.stack([np.asarray(r.logprobs) for r in singles]),
                             atol=1e-6, rtol=0)
  np.testing.assert_array_equal(np.asarray(state.next_pos), one_pos)
  assert list(np.asarray(multi.active)[0]) == [True, True, True] + [False] * (engine.num_slots - 3)


def test_free_stops_a_slot_and_insert_reuses_it(engine, actor, actor_params):
  params = engine.load_params(actor_params)
  state = engine.init_decode_state()
  a = engine.prefill(params, [1, 2, 3, 4, 5], jax.random.key(7))
  state = engine.insert(a, state, 0)
  state, _ = engine.generate(params, state)
  state = engine.free(state, 0)
  pos_before = int(state.next_pos[0])
  state, res = engine.generate(params, state)
  assert not bool(res.active[0]) and int(state.next_pos[0]) == pos_before
  # A new request in the same slot sees nothing of the old one.
  prompt = [9, 8, 7]
  b = engine.prefill(params, prompt, jax.random.key(3), temperature=0.0)
  state = engine.insert(b, state, 0)
  out, lps = [int(b.token[0])], [float(b.logprob[0])]
  for _ in range(6):
    state, res = engine.generate(params, state)
    out.append(int(res.tokens[0]))
    lps.append(float(res.logprobs[0]))
  ref = reference_logprobs(actor, actor_params, [prompt], [out])[0]
  np.testing.assert_allclose(lps, ref, atol=TOL, rtol=0)


@pytest.mark.slow
def test_tensor_parallel_sampling_mesh(cfg, actor, actor_params):
  """sampler.num_devices=2: the engine runs tensor-parallel (KV heads split) with the same logprobs."""
  engine = engine_with(cfg, decode_impl="slot", num_devices=2)
  assert engine.mesh.shape["tensor"] == 2
  params = engine.load_params(actor_params)
  prompt = list(range(5, 22))
  state = engine.init_decode_state()
  pre = engine.prefill(params, prompt, jax.random.key(0))
  state = engine.insert(pre, state, 2)
  out, lps = [int(pre.token[0])], [float(pre.logprob[0])]
  for _ in range(7):
    state, res = engine.generate(params, state)
    out.append(int(res.tokens[2]))
    lps.append(float(res.logprobs[2]))
  np.testing.assert_allclose(lps, reference_logprobs(actor, actor_params, [prompt], [out])[0], atol=TOL, rtol=0)


def test_loaded_params_survive_the_source_being_deleted(engine, actor_params):
  """load_params copies even within one mesh: the learner may donate (delete) its buffers afterwards."""
  src = engine.load_params(actor_params)
  mine = engine.load_params(src)
  expected = float(engine.prefill(src, [1, 2, 3], jax.random.key(0)).logprob[0])
  jax.tree.map(lambda x: x.delete(), src)
  assert float(engine.prefill(mine, [1, 2, 3], jax.random.key(0)).logprob[0]) == expected


def test_slot_decode_updates_the_cache_in_place(cfg):
  """The compiled decode call aliases the donated cache and needs scratch of about one layer's K and V, where
  MaxText's autoregressive mode needs two whole copies of the cache (the reason the slot cache exists)."""
  from rsi_jax.config import with_overrides
  big = with_overrides(cfg, {"sampler": {"max_cache_length": 1024}, "model": {"max_target_length": 1024}})
  scratch = {}
  for impl in ("slot", "maxtext"):
    engine = engine_with(big, decode_impl=impl)
    params, state = engine.init_params(0), engine.init_decode_state()
    cache_bytes = sum(x.nbytes for x in jax.tree.leaves(state.cache))
    mem = engine._generate_steps_jit.lower(params, state, 2).compile().memory_analysis()
    assert mem.alias_size_in_bytes >= cache_bytes  # the output cache is the donated input buffer
    scratch[impl] = mem.temp_size_in_bytes / cache_bytes
  layers = cfg.model.base_num_decoder_layers
  assert scratch["slot"] < 1.2 / layers, scratch
  assert scratch["maxtext"] > 1.5, scratch
