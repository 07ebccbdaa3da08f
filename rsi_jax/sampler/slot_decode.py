"""Qwen3 decode over a per-slot KV cache: one new token for every slot, each at its own position.

The decode step of :class:`~rsi_jax.sampler.engine.Engine` (``sampler.decode_impl: slot``). It reads the
actor's MaxText params tree unchanged (scanned layers, layer axis 1) and computes exactly MaxText's Qwen3
layer (``maxtext.models.qwen3.Qwen3DecoderLayer``): pre-attention RMSNorm -> q/k/v projections -> per-head
q/k RMSNorm -> RoPE (rotate-half, MaxText's timescales) -> q * head_dim^-0.5 -> grouped-query attention ->
output projection -> residual -> post-attention RMSNorm -> SwiGLU MLP -> residual. The prompt's KV prefix
comes from MaxText's own prefill (:meth:`Engine.prefill`).

Why not MaxText's autoregressive mode: it keeps a shared ring buffer beside a per-slot prefill cache and, in
the compiled step, transposes and copies every layer's whole cache each step. Here the cache is one array
per K and V, ``(layers, slots, max_cache_length, kv_heads, head_dim)``; a step writes one entry per slot in
place (the layer loop carries the cache, the jitted call donates it) and attention reads each slot's entries
``0..pos`` under a mask. A slot holds ``max_cache_length`` positions, prompt included.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rms_norm(x, scale, eps: float, dtype):
  """MaxText ``RMSNorm``: normalise in float32, cast to ``dtype``, then scale (in ``dtype``)."""
  x = x.astype(jnp.float32)
  y = (x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)).astype(dtype)
  return y * scale.astype(dtype)


def rope(x, positions, max_timescale: float, min_timescale: float = 1.0):
  """MaxText ``RotaryEmbedding`` (default type): x (S, H, D) rotated by ``positions`` (S,)."""
  d = x.shape[-1]
  fraction = 2 * jnp.arange(0, d // 2) / d
  timescale = min_timescale * (max_timescale / min_timescale) ** fraction
  angle = positions.astype(jnp.float32)[:, None, None] / timescale  # (S, 1, D/2)
  sin = jnp.concatenate([jnp.sin(angle)] * 2, axis=-1).astype(x.dtype)
  cos = jnp.concatenate([jnp.cos(angle)] * 2, axis=-1).astype(x.dtype)
  x1, x2 = jnp.split(x, 2, axis=-1)
  return x * cos + jnp.concatenate((-x2, x1), axis=-1) * sin


def _dot(x, w, spec, dtype):
  return jnp.einsum(spec, x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32).astype(dtype)


def decode_step(params, k_cache, v_cache, tokens, positions, *, eps: float, rope_max_timescale: float,
                rope_min_timescale: float = 1.0, dtype=jnp.float32):
  """One token per slot through every layer.

  Args:
    params: the MaxText Qwen3 params dict (see :mod:`rsi_jax.models.actor`).
    k_cache, v_cache: (L, S, T, K, D) post-RoPE keys and values of every slot's earlier positions.
    tokens: (S,) int32 input token of each slot; positions: (S,) int32 its position (< T to be cached;
      a position >= T is not written and the slot's output is garbage).
  Returns:
    final-normed hidden (S, E) in ``dtype`` and the updated caches (entry ``positions[s]`` of slot s set).
  """
  layers = params["decoder"]["layers"]
  n_layers = layers["pre_self_attention_layer_norm"]["scale"].shape[1]
  s, t, n_kv, d = k_cache.shape[1:]
  x = params["token_embedder"]["embedding"][tokens].astype(dtype)  # (S, E)
  visible = jnp.arange(t)[None, :] <= positions[:, None]  # (S, T): this slot's entries 0..pos
  rows = jnp.arange(s)

  def layer(carry, i):
    x, k_cache, v_cache = carry
    w = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, axis=1, keepdims=False), layers)
    att = w["self_attention"]
    h = rms_norm(x, w["pre_self_attention_layer_norm"]["scale"], eps, dtype)
    q = _dot(h, att["query"]["kernel"], "se,ehd->shd", dtype)  # (S, H, D)
    k = _dot(h, att["key"]["kernel"], "se,ehd->shd", dtype)  # (S, K, D)
    v = _dot(h, att["value"]["kernel"], "se,ehd->shd", dtype)
    q = rope(rms_norm(q, att["query_norm"]["scale"], eps, dtype), positions, rope_max_timescale,
             rope_min_timescale)
    k = rope(rms_norm(k, att["key_norm"]["scale"], eps, dtype), positions, rope_max_timescale,
             rope_min_timescale)
    q = q * jnp.asarray(d ** -0.5, dtype)
    k_cache = k_cache.at[i, rows, positions].set(k.astype(k_cache.dtype), mode="drop")
    v_cache = v_cache.at[i, rows, positions].set(v.astype(v_cache.dtype), mode="drop")
    keys = k_cache[i]  # (S, T, K, D)
    values = v_cache[i]
    qg = q.reshape(s, n_kv, -1, d)  # (S, K, G, D): query head h uses kv head h // G
    logits = jnp.einsum("skgd,stkd->skgt", qg, keys.astype(dtype), preferred_element_type=jnp.float32)
    logits = jnp.where(visible[:, None, None, :], logits, -jnp.inf)
    probs = jax.nn.softmax(logits, axis=-1).astype(dtype)
    o = jnp.einsum("skgt,stkd->skgd", probs, values.astype(dtype), preferred_element_type=jnp.float32)
    o = o.astype(dtype).reshape(s, -1, d)  # (S, H, D)
    x = x + _dot(o, att["out"]["kernel"], "shd,hde->se", dtype)
    h = rms_norm(x, w["post_self_attention_layer_norm"]["scale"], eps, dtype)
    mlp = w["mlp"]
    gate = jax.nn.silu(_dot(h, mlp["wi_0"]["kernel"], "se,em->sm", dtype))
    up = _dot(h, mlp["wi_1"]["kernel"], "se,em->sm", dtype)
    x = x + _dot(gate * up, mlp["wo"]["kernel"], "sm,me->se", dtype)
    return (x, k_cache, v_cache), None

  (x, k_cache, v_cache), _ = jax.lax.scan(layer, (x, k_cache, v_cache), jnp.arange(n_layers))
  h = rms_norm(x, params["decoder"]["decoder_norm"]["scale"], eps, dtype)
  return h, k_cache, v_cache
