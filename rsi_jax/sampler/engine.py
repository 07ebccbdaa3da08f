"""A JetStream-shaped decode engine for the MaxText Qwen3 model.

The engine owns no request bookkeeping; it is jitted pure functions over a :class:`DecodeState`:

* :meth:`Engine.prefill` runs one prompt (padded to a length bucket, batch 1) through MaxText's model in
  ``MODEL_MODE_PREFILL`` and samples its first token -> a :class:`Prefix` (its KV cache + first token).
* :meth:`Engine.insert` copies a prefix into one slot of the decode state.
* :meth:`Engine.generate` runs one decode step for every slot, each at its own position, and samples each
  slot's next token with that slot's parameters and key; :meth:`Engine.generate_steps` runs several such
  steps in one call (one dispatch and one host round trip for ``n`` tokens per slot).
* :meth:`Engine.free` deactivates a slot (its row keeps being computed but no longer advances).

Two decode implementations (``sampler.decode_impl``):

``slot`` (default)
  :mod:`rsi_jax.sampler.slot_decode`: one KV array per K and V with a row of ``max_cache_length`` positions
  per slot, written in place. Insert copies the MaxText prefill cache into the slot's first positions. A slot
  holds ``max_cache_length`` positions, prompt included, so it generates up to
  ``max_cache_length - prompt_len + 1`` tokens (:meth:`Engine.token_limit`).
``maxtext``
  MaxText's own ``MODEL_MODE_AUTOREGRESSIVE``: a per-slot *prefill* cache (``max_prefill_length`` entries,
  padding masked by segment id 0) and an *autoregressive* ring buffer (``max_cache_length -
  max_prefill_length`` entries) whose write index is shared by all slots. Insert zeroes the slot's
  autoregressive segment ids, so a slot attends only to entries written since it was inserted; as keys carry
  their own RoPE position, their order in the ring does not matter. A slot holds ``ar_capacity`` generated
  tokens before the ring would overwrite its own oldest entry. Its compiled step copies every layer's whole
  cache (kept as the reference the benchmark compares against). The insert rule follows MaxText's
  ``MaxEngine._insert_jit`` (which cannot be imported without the archived JetStream package).

Both give the actor's full-forward logprobs (``tests/sampler/test_engine.py``).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax import struct
from flax.core.spmd import logical_axis_rules

from rsi_jax.distributed import to_local
from rsi_jax.sampler.sampling import sample_tokens, token_key

HEAD_KEY = "sampler_lm_head"  # (E, V) copy of a tied head in params from Engine.load_params (CPU only)


def model_params(params) -> dict:
  """The MaxText params tree alone: ``params`` without the sampler's ``HEAD_KEY`` copy (for MaxText and the
  actor, which take exactly the model's tree)."""
  return {k: v for k, v in params.items() if k != HEAD_KEY}


@struct.dataclass
class Prefix:
  """One prefilled request, ready to insert. Batch dimension 1 throughout."""
  cache: Any  # pure-dict prefill KV cache (sequence length = the prefill bucket)
  token: jax.Array  # (1,) int32 first generated token
  logprob: jax.Array  # (1,) float32 its logprob under log_softmax(raw logits)
  next_pos: jax.Array  # (1,) int32 position of ``token`` (= prompt length)
  key: jax.Array  # (1,) typed PRNG key of the request
  temperature: jax.Array  # (1,) float32
  top_k: jax.Array  # (1,) int32
  top_p: jax.Array  # (1,) float32


@struct.dataclass
class DecodeState:
  """All slots of the decoder. S = num_slots."""
  cache: Any  # pure-dict MaxText KV cache, autoregressive mode, batch S
  tokens: jax.Array  # (S,) int32 last token of each slot (the next step's input)
  next_pos: jax.Array  # (S,) int32 position of that token
  n_generated: jax.Array  # (S,) int32 tokens generated so far (indexes the per-token key)
  keys: jax.Array  # (S,) typed PRNG keys, one per request
  temperature: jax.Array  # (S,) float32
  top_k: jax.Array  # (S,) int32
  top_p: jax.Array  # (S,) float32
  active: jax.Array  # (S,) bool


@struct.dataclass
class StepResult:
  """One decode step ((S,) arrays), or ``n`` steps from :meth:`Engine.generate_steps` ((n, S) arrays)."""
  tokens: jax.Array  # int32 token sampled for each slot
  logprobs: jax.Array  # float32 its logprob
  active: jax.Array  # bool whether the slot was active (inactive rows are garbage)


class Engine:
  """Prefill / insert / generate over MaxText's Qwen3 decoder. Parameters are passed to every call.

  Args:
    mt_config: a MaxText config from :func:`~rsi_jax.sampler.factory.maxtext_sampler_config`.
    mesh: the sampling mesh (:func:`~rsi_jax.sampler.factory.sampler_mesh`).
    prefill_buckets: prompt lengths prefill is compiled for; a prompt is padded to the smallest bucket that
      holds it (bounds recompiles to one per bucket).
    logits_dtype: the LM head's operand dtype (``model.logits_dtype``), as the actor's.
    decode_impl: "slot" or "maxtext" (module docstring).
    attention_block: cache positions per attention block of the slot decode; a step reads only the blocks
      up to the furthest active position (the cache is allocated in whole blocks).
  """

  def __init__(self, mt_config, mesh: jax.sharding.Mesh, prefill_buckets=(), logits_dtype="float32",
               decode_impl: str = "slot", attention_block: int = 512):
    from maxtext.common.common_types import MODEL_MODE_AUTOREGRESSIVE, MODEL_MODE_PREFILL
    from maxtext.utils import model_creation_utils, sharding

    self.config = mt_config
    self.mesh = mesh
    self.num_slots = int(mt_config.micro_batch_size_to_train_on)
    self.max_prefill_length = int(mt_config.max_prefill_predict_length)
    self.max_cache_length = int(mt_config.max_target_length)
    self.ar_capacity = self.max_cache_length - self.max_prefill_length
    if decode_impl not in ("slot", "maxtext"):
      raise ValueError(f"decode_impl must be 'slot' or 'maxtext', got {decode_impl!r}")
    self.decode_impl = decode_impl
    block_type = getattr(mt_config.decoder_block, "value", mt_config.decoder_block)
    if decode_impl == "slot" and block_type != "qwen3":
      raise ValueError(f"decode_impl 'slot' implements the dense Qwen3 layer only; decoder_block is "
                       f"{block_type!r} (use sampler.decode_impl=maxtext)")
    buckets = sorted({int(b) for b in prefill_buckets if b <= self.max_prefill_length}
                     | {self.max_prefill_length})
    self.prefill_buckets = tuple(buckets)
    self._modes = (MODEL_MODE_PREFILL, MODEL_MODE_AUTOREGRESSIVE)
    self.tied = bool(mt_config.logits_via_embedding)
    # On CPU, x @ E^T with the tied (V, E) embedding reads it about 1.4x slower than x @ W with a contiguous
    # (E, V) copy (2.6-3.0 ms vs 1.9-2.1 ms per decode step for the 151,936-entry vocabulary), so loaded
    # params carry that copy under HEAD_KEY. GPU/TPU matmuls take the transposed operand at no cost.
    self._head_copy = self.tied and mesh.devices.flat[0].platform == "cpu"
    self._transpose_jit = jax.jit(lambda e: e.T.copy()) if self._head_copy else None
    self.logits_dtype = jnp.dtype(logits_dtype)

    with logical_axis_rules(mt_config.logical_axis_rules):
      self._create_prefill = model_creation_utils.get_nnx_create_model_fn(
          mt_config, mesh=mesh, model_mode=MODEL_MODE_PREFILL)
      create_ar = model_creation_utils.get_nnx_create_model_fn(
          mt_config, mesh=mesh, model_mode=MODEL_MODE_AUTOREGRESSIVE)
      abs_prefill = nnx.eval_shape(self._create_prefill)
      abs_ar = nnx.eval_shape(create_ar)
    # Layers may fix their mode at construction, so each mode runs with the graph built for it.
    self._graph_prefill, abs_params, self._cache_prefill_tpl, abs_rest = nnx.split(
        abs_prefill, nnx.Param, nnx.Cache, ...)
    self._graph_ar, _, self._cache_ar_tpl, _ = nnx.split(abs_ar, nnx.Param, nnx.Cache, ...)
    self._rest = _materialize_rest(abs_rest)
    with logical_axis_rules(mt_config.logical_axis_rules):
      param_shardings = sharding.nnx_construct_named_sharding(abs_params, mesh)
      cache_shardings = sharding.nnx_construct_named_sharding(self._cache_ar_tpl, mesh)
    self._abs_params = abs_params
    # Params are the plain nested dict ``nnx.to_pure_dict(nnx.state(model, nnx.Param))``, as the actor's.
    self.param_shardings = nnx.to_pure_dict(param_shardings)
    self._cache_shardings = nnx.to_pure_dict(cache_shardings)
    # Logical axis names of every autoregressive cache leaf: insert finds each leaf's batch axis here.
    self._cache_axes = nnx.to_pure_dict(jax.tree.map(
        lambda v: tuple(v.get_metadata()["sharding_names"]), self._cache_ar_tpl,
        is_leaf=lambda x: isinstance(x, nnx.Variable)))
    self._replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    if decode_impl == "slot":
      n_kv, head_dim = int(mt_config.num_kv_heads), int(mt_config.head_dim)
      self.attention_block = min(int(attention_block), self.max_cache_length)
      alloc = -(-self.max_cache_length // self.attention_block) * self.attention_block
      self._slot_shape = (int(mt_config.num_decoder_layers), self.num_slots, alloc, n_kv, head_dim)
      tp = mesh.shape["tensor"]
      # KV heads split over the tensor axis as the attention weights are; replicated when they do not divide.
      spec = jax.sharding.PartitionSpec(None, None, None, "tensor" if n_kv % tp == 0 else None, None)
      kv = jax.sharding.NamedSharding(mesh, spec)
      self._cache_shardings = {"k": kv, "v": kv}
      self._dtype = jnp.dtype(mt_config.dtype)
    # Every decode state carries the same shardings (cache: MaxText's; the rest replicated), so the state
    # coming out of one call never recompiles the next.
    r = self._replicated
    self._state_shardings = DecodeState(cache=self._cache_shardings, tokens=r, next_pos=r, n_generated=r,
                                        keys=r, temperature=r, top_k=r, top_p=r, active=r)
    self._prefill_jit = jax.jit(self._prefill_impl)
    self._insert_jit = jax.jit(self._insert_impl, donate_argnums=(1,), out_shardings=self._state_shardings)
    self._generate_jit = jax.jit(self._generate_impl, donate_argnums=(1,),
                                 out_shardings=(self._state_shardings, r))
    self._generate_steps_jit = jax.jit(self._generate_steps_impl, donate_argnums=(1,), static_argnums=(2,),
                                       out_shardings=(self._state_shardings, r))
    self._free_jit = jax.jit(self._free_impl, donate_argnums=(0,), out_shardings=self._state_shardings)

  # ------------------------------------------------------------------------------------------ params

  def init_params(self, rng: jax.Array | int = 0):
    """Random MaxText initialisation of the parameters, sharded on the sampling mesh (tests, benchmarks)."""
    key = jax.random.key(rng) if isinstance(rng, int) else rng
    from maxtext.utils import model_creation_utils
    from maxtext.common.common_types import MODEL_MODE_PREFILL
    create = model_creation_utils.get_nnx_create_model_fn(
        self.config, mesh=self.mesh, model_mode=MODEL_MODE_PREFILL, rng_key=key)

    def init():
      return nnx.to_pure_dict(nnx.state(create(), nnx.Param))

    with logical_axis_rules(self.config.logical_axis_rules):
      return jax.jit(init, out_shardings=self.param_shardings)()

  def load_params(self, params):
    """Reshard parameters (the actor's pure-dict tree, or an ``nnx.State`` of it, on any mesh) onto the
    sampling mesh: the training -> sampling weight transfer. On CPU with a tied head the result also holds
    an (E, V) copy of the head under ``HEAD_KEY``."""
    if isinstance(params, nnx.State):
      params = nnx.to_pure_dict(params)
    params = model_params(params)
    # Always a copy: the learner may donate its buffers to the next update while the sampler keeps these.
    # Learner weights sharded across processes are gathered onto this process's devices first.
    params = to_local(params, self.param_shardings)
    if self._head_copy:
      params[HEAD_KEY] = self._transpose_jit(params["token_embedder"]["embedding"])
    return params

  # ------------------------------------------------------------------------------------------ state

  def init_decode_state(self) -> DecodeState:
    s = self.num_slots
    if self.decode_impl == "slot":
      cache = {"k": jnp.zeros(self._slot_shape, self._dtype), "v": jnp.zeros(self._slot_shape, self._dtype)}
    else:
      cache = jax.tree.map(lambda v: jnp.zeros(v.shape, v.dtype), nnx.to_pure_dict(self._cache_ar_tpl))
    state = DecodeState(
        cache=cache, tokens=jnp.zeros((s,), jnp.int32), next_pos=jnp.zeros((s,), jnp.int32),
        n_generated=jnp.zeros((s,), jnp.int32), keys=jax.random.split(jax.random.key(0), s),
        temperature=jnp.ones((s,), jnp.float32), top_k=jnp.zeros((s,), jnp.int32),
        top_p=jnp.ones((s,), jnp.float32), active=jnp.zeros((s,), bool))
    return jax.device_put(state, self._state_shardings)

  def token_limit(self, prompt_len: int) -> int:
    """Most tokens a slot can generate for a prompt of ``prompt_len`` tokens (the last sampled token is
    never written to the cache). The caller ends the request there (``finish_reason = "cache_full"``)."""
    if self.decode_impl == "slot":
      return self.max_cache_length - prompt_len + 1
    return self.ar_capacity + 1

  def bucket(self, length: int) -> int:
    """The smallest prefill bucket holding ``length`` tokens."""
    for b in self.prefill_buckets:
      if length <= b:
        return b
    raise ValueError(f"prompt of {length} tokens exceeds max_prefill_length={self.max_prefill_length}")

  # ------------------------------------------------------------------------------------------ API

  def prefill(self, params, prompt_ids, key: jax.Array, temperature: float = 1.0, top_k: int = 0,
              top_p: float = 1.0) -> Prefix:
    """Prompt ids (n,) -> its KV prefix and first sampled token (sampled with ``token_key(key, 0)``)."""
    n = len(prompt_ids)
    if n == 0:
      raise ValueError("empty prompt")
    padded = np.zeros((1, self.bucket(n)), np.int32)
    padded[0, :n] = np.asarray(prompt_ids, np.int32)
    return self._prefill_jit(params, jnp.asarray(padded), jnp.int32(n), key[None],
                             jnp.full((1,), temperature, jnp.float32), jnp.full((1,), top_k, jnp.int32),
                             jnp.full((1,), top_p, jnp.float32))

  def insert(self, prefix: Prefix, state: DecodeState, slot: int) -> DecodeState:
    """Copy ``prefix`` into ``slot`` (donates ``state``) and activate the slot."""
    return self._insert_jit(prefix, state, jnp.int32(slot))

  def generate(self, params, state: DecodeState) -> tuple[DecodeState, StepResult]:
    """One decode step for every slot (donates ``state``)."""
    return self._generate_jit(params, state)

  def generate_steps(self, params, state: DecodeState, num_steps: int) -> tuple[DecodeState, StepResult]:
    """``num_steps`` decode steps in one call (donates ``state``); the result's arrays are (num_steps, S).

    Identical to calling :meth:`generate` ``num_steps`` times (each token's key depends only on its request
    and its index). A slot that passes its :meth:`token_limit` inside the call produces garbage there,
    which the caller discards."""
    return self._generate_steps_jit(params, state, int(num_steps))

  def free(self, state: DecodeState, slot: int) -> DecodeState:
    """Release ``slot``: it stops advancing until the next insert (donates ``state``)."""
    return self._free_jit(state, jnp.int32(slot))

  # ------------------------------------------------------------------------------------------ jitted

  def _hidden(self, mode_idx, params, cache, tokens, positions, segment_ids=None):
    """MaxText decoder in one of its decode modes -> (final-normed hidden (B, T, E), new pure-dict cache)."""
    mode = self._modes[mode_idx]
    graph, tpl = ((self._graph_prefill, self._cache_prefill_tpl) if mode_idx == 0
                  else (self._graph_ar, self._cache_ar_tpl))
    param_state = jax.tree.map(lambda x: x, self._abs_params)
    nnx.replace_by_pure_dict(param_state, model_params(params))
    cache_state = jax.tree.map(lambda x: x, tpl)
    nnx.replace_by_pure_dict(cache_state, cache)
    with logical_axis_rules(self.config.logical_axis_rules):
      model = nnx.merge(graph, param_state, cache_state, self._rest, copy=True)
      # Its own logits are dropped: the head below is the actor's (float32), so sampled logprobs equal the
      # learner's full-forward logprobs.
      _, hidden, _ = model.decoder(shared_embedding=model.token_embedder, decoder_input_tokens=tokens,
                                   decoder_positions=positions, decoder_segment_ids=segment_ids,
                                   deterministic=True, model_mode=mode)
      hidden = model.decoder.decoder_norm(hidden)
    return hidden, nnx.to_pure_dict(nnx.state(model, nnx.Cache))

  def _logits(self, params, h):
    """Final-normed hidden (B, E) -> float32 logits (B, V) exactly as the actor computes them."""
    from rsi_jax.models.actor import lm_head_weight, project_logits  # traced once per compile
    w = params[HEAD_KEY] if HEAD_KEY in params else lm_head_weight(params, self.tied)
    return project_logits(h, w, self.logits_dtype)

  def _prefill_impl(self, params, padded, true_length, key, temperature, top_k, top_p):
    bucket = padded.shape[1]
    positions = jnp.arange(bucket, dtype=jnp.int32)[None]
    segment_ids = (positions < true_length).astype(jnp.int32)  # 1 = prompt token, 0 = padding
    cache = jax.tree.map(lambda v: jnp.zeros(v.shape, v.dtype), nnx.to_pure_dict(self._cache_prefill_tpl))
    hidden, cache = self._hidden(0, params, cache, padded, positions, segment_ids)
    last = jax.lax.dynamic_index_in_dim(hidden[0], true_length - 1, axis=0, keepdims=True)  # (1, E)
    logits = jax.lax.with_sharding_constraint(self._logits(params, last), self._replicated)
    tok, lp = sample_tokens(logits, jax.vmap(token_key)(key, jnp.zeros((1,), jnp.int32)), temperature,
                            top_k, top_p)
    return Prefix(cache=cache, token=tok, logprob=lp, next_pos=true_length[None], key=key,
                  temperature=temperature, top_k=top_k, top_p=top_p)

  def _insert_impl(self, prefix: Prefix, state: DecodeState, slot):
    if self.decode_impl == "slot":
      cache = self._insert_slot(prefix.cache, state.cache, slot)
    else:
      cache = self._insert_maxtext(prefix.cache, state.cache, slot)
    cache = jax.lax.with_sharding_constraint(cache, self._cache_shardings)
    put = lambda full, part: full.at[slot].set(part[0])
    return DecodeState(
        cache=cache, tokens=put(state.tokens, prefix.token), next_pos=put(state.next_pos, prefix.next_pos),
        n_generated=state.n_generated.at[slot].set(1), keys=put(state.keys, prefix.key),
        temperature=put(state.temperature, prefix.temperature), top_k=put(state.top_k, prefix.top_k),
        top_p=put(state.top_p, prefix.top_p), active=state.active.at[slot].set(True))

  def _insert_slot(self, prefill_cache, cache, slot):
    """MaxText's prefill K/V (layers, bucket, kv_heads, 1, head_dim) -> positions [0, bucket) of ``slot``.
    Positions past the prompt hold padding keys; decode overwrites each before any query can see it."""
    kv = prefill_cache["decoder"]["layers"]["self_attention"]["KVCache_0"]
    out = {}
    for name, leaf in (("k", "cached_prefill_key"), ("v", "cached_prefill_value")):
      part = jnp.transpose(kv[leaf], (0, 3, 1, 2, 4))  # (L, 1, bucket, K, D)
      out[name] = _update_slot(cache[name], part, slot, 1)
    return out

  def _insert_maxtext(self, prefill_cache, ar_cache, slot):
    def copy(path, part, full, axes):
      name = path[-1].key
      if name in ("cache_ar_index", "cached_ar_key", "cached_ar_value"):
        return full  # shared ring buffer; the slot's old entries are masked by its segment ids
      b = axes.index("cache_batch")
      if name == "cache_ar_segment_id":  # forget everything the previous occupant wrote
        return jax.lax.dynamic_update_index_in_dim(full, _zeros_at(full, b), slot, b)
      if name == "cached_ar_lengths":
        return jax.lax.dynamic_update_index_in_dim(full, _zeros_at(full, b), slot, b)
      if name == "cache_prefill_segment_id":  # the bucket may be shorter than the cache: zero the rest
        full = jax.lax.dynamic_update_index_in_dim(full, _zeros_at(full, b), slot, b)
        return _update_slot(full, part, slot, b)
      if name in ("cached_prefill_key", "cached_prefill_value"):
        return _update_slot(full, part, slot, b)
      raise ValueError(f"no insert rule for cache leaf {name!r}")

    return jax.tree_util.tree_map_with_path(copy, prefill_cache, ar_cache, self._cache_axes)

  def _decode_hidden(self, params, state: DecodeState):
    """Final-normed hidden (S, E) of every slot's current token and the cache with it written."""
    if self.decode_impl == "slot":
      from rsi_jax.sampler.slot_decode import decode_step
      mt = self.config
      h, k, v = decode_step(params, state.cache["k"], state.cache["v"], state.tokens, state.next_pos,
                            state.active, eps=float(mt.normalization_layer_epsilon),
                            rope_max_timescale=float(mt.rope_max_timescale),
                            rope_min_timescale=float(mt.rope_min_timescale), dtype=self._dtype,
                            block=self.attention_block)
      return h, {"k": k, "v": v}
    hidden, cache = self._hidden(1, params, state.cache, state.tokens[:, None], state.next_pos[:, None])
    return hidden[:, 0], cache

  def _generate_steps_impl(self, params, state: DecodeState, num_steps: int):
    return jax.lax.scan(lambda st, _: self._generate_impl(params, st), state, None, length=num_steps)

  def _generate_impl(self, params, state: DecodeState):
    hidden, cache = self._decode_hidden(params, state)
    logits = jax.lax.with_sharding_constraint(self._logits(params, hidden), self._replicated)  # (S, V)
    cache = jax.lax.with_sharding_constraint(cache, self._cache_shardings)
    keys = jax.vmap(token_key)(state.keys, state.n_generated)
    tok, lp = sample_tokens(logits, keys, state.temperature, state.top_k, state.top_p)
    act = state.active
    new = state.replace(
        cache=cache, tokens=jnp.where(act, tok, state.tokens),
        next_pos=state.next_pos + act.astype(jnp.int32),
        n_generated=state.n_generated + act.astype(jnp.int32))
    return new, StepResult(tokens=tok, logprobs=lp, active=act)

  def _free_impl(self, state: DecodeState, slot):
    return state.replace(active=state.active.at[slot].set(False))


def _zeros_at(full, axis):
  shape = list(full.shape)
  shape[axis] = 1
  return jnp.zeros(shape, full.dtype)


def _update_slot(full, part, slot, axis):
  """Write ``part`` (size 1 on ``axis``, possibly shorter on the sequence axis) at ``slot``, offset 0."""
  start = [0] * full.ndim
  start[axis] = slot
  return jax.lax.dynamic_update_slice(full, part.astype(full.dtype), [jnp.asarray(s, jnp.int32)
                                                                        for s in start])


def _materialize_rest(abs_rest):
  """Concrete values for the model's non-parameter, non-cache state (RNG streams); unused at decode."""
  def make(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      return jax.random.split(jax.random.key(0), math.prod(x.shape) or 1)[:math.prod(x.shape)].reshape(
          x.shape) if x.shape else jax.random.key(0)
    return jnp.zeros(x.shape, x.dtype)
  return jax.tree.map(make, abs_rest)
