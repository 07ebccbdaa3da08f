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
place (the layer loop carries the cache, the jitted call donates it). Attention walks the cache in blocks of
``block`` positions with an online softmax and stops after the block holding the furthest position of any
active slot, so a step reads what the batch has written, not the whole capacity (a 32k-position cache with
short sequences costs no more than a short cache). A slot holds ``max_cache_length`` positions, prompt
included.
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


def qwen3_layers(params, tokens, positions, caches, attend, *, eps: float, rope_max_timescale: float,
                 rope_min_timescale: float = 1.0, dtype=jnp.float32):
  """MaxText's Qwen3 decoder over N tokens (one row each), the KV cache left to ``attend``.

  ``attend(i, q, k, v, caches) -> (o, caches)`` gets layer ``i``'s queries (N, H, D) (RoPE'd and scaled by
  head_dim^-0.5) and post-RoPE keys / values (N, K, D), writes them into ``caches`` (any pytree carried
  through the layer scan) and returns the attention output (N, H, D) and the updated caches.
  Returns the final-normed hidden (N, E) in ``dtype`` and the caches.
  """
  layers = params["decoder"]["layers"]
  n_layers = layers["pre_self_attention_layer_norm"]["scale"].shape[1]
  x = params["token_embedder"]["embedding"][tokens].astype(dtype)  # (N, E)

  def layer(carry, i):
    x, caches = carry
    w = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, axis=1, keepdims=False), layers)
    att = w["self_attention"]
    h = rms_norm(x, w["pre_self_attention_layer_norm"]["scale"], eps, dtype)
    q = _dot(h, att["query"]["kernel"], "se,ehd->shd", dtype)  # (N, H, D)
    k = _dot(h, att["key"]["kernel"], "se,ehd->shd", dtype)  # (N, K, D)
    v = _dot(h, att["value"]["kernel"], "se,ehd->shd", dtype)
    q = rope(rms_norm(q, att["query_norm"]["scale"], eps, dtype), positions, rope_max_timescale,
             rope_min_timescale)
    k = rope(rms_norm(k, att["key_norm"]["scale"], eps, dtype), positions, rope_max_timescale,
             rope_min_timescale)
    q = q * jnp.asarray(q.shape[-1] ** -0.5, dtype)
    o, caches = attend(i, q, k, v, caches)
    x = x + _dot(o.astype(dtype), att["out"]["kernel"], "shd,hde->se", dtype)
    h = rms_norm(x, w["post_self_attention_layer_norm"]["scale"], eps, dtype)
    mlp = w["mlp"]
    gate = jax.nn.silu(_dot(h, mlp["wi_0"]["kernel"], "se,em->sm", dtype))
    up = _dot(h, mlp["wi_1"]["kernel"], "se,em->sm", dtype)
    x = x + _dot(gate * up, mlp["wo"]["kernel"], "sm,me->se", dtype)
    return (x, caches), None

  (x, caches), _ = jax.lax.scan(layer, (x, caches), jnp.arange(n_layers))
  return rms_norm(x, params["decoder"]["decoder_norm"]["scale"], eps, dtype), caches


def decode_step(params, k_cache, v_cache, tokens, positions, active=None, *, eps: float,
                rope_max_timescale: float, rope_min_timescale: float = 1.0, dtype=jnp.float32,
                block: int | None = None):
  """One token per slot through every layer.

  Args:
    params: the MaxText Qwen3 params dict (see :mod:`rsi_jax.models.actor`).
    k_cache, v_cache: (L, S, T, K, D) post-RoPE keys and values of every slot's earlier positions.
    tokens: (S,) int32 input token of each slot; positions: (S,) int32 its position (< T to be cached;
      a position >= T is not written and the slot's output is garbage).
    active: (S,) bool, default all; inactive slots do not extend how far attention reads (their output is
      garbage).
    block: cache positions per attention block (T must be a multiple; default T, one block).
  Returns:
    final-normed hidden (S, E) in ``dtype`` and the updated caches (entry ``positions[s]`` of slot s set).
  """
  s, t, n_kv, d = k_cache.shape[1:]
  block = block or t
  if t % block:
    raise ValueError(f"cache length {t} is not a multiple of the attention block {block}")
  rows = jnp.arange(s)
  reach = jnp.max(jnp.where(True if active is None else active, positions, 0))
  n_blocks = jnp.minimum(reach // block + 1, t // block)  # blocks holding any active slot's entries

  def attend(i, q, k, v, caches):
    k_cache, v_cache = caches
    k_cache = k_cache.at[i, rows, positions].set(k.astype(k_cache.dtype), mode="drop")
    v_cache = v_cache.at[i, rows, positions].set(v.astype(v_cache.dtype), mode="drop")
    qg = q.reshape(s, n_kv, -1, d)  # (S, K, G, D): query head h uses kv head h // G
    o = _attend(qg, k_cache, v_cache, i, positions, n_blocks, block, dtype)
    return o.reshape(s, -1, d), (k_cache, v_cache)

  h, (k_cache, v_cache) = qwen3_layers(params, tokens, positions, (k_cache, v_cache), attend, eps=eps,
                                       rope_max_timescale=rope_max_timescale,
                                       rope_min_timescale=rope_min_timescale, dtype=dtype)
  return h, k_cache, v_cache


def _attend(qg, k_cache, v_cache, layer, positions, n_blocks, block: int, dtype):
  """softmax(q . k) v over cache entries 0..positions[s] of each slot s of ``layer``, ``block`` entries at a
  time for the first ``n_blocks`` blocks (online softmax, float32 statistics). Returns (S, K, G, D) float32."""
  s, n_kv, g, d = qg.shape
  _, _, _, _, dv = v_cache.shape

  def scores(j):
    start = (layer, 0, j * block, 0, 0)
    kb = jax.lax.dynamic_slice(k_cache, start, (1, s, block, n_kv, d))[0]
    vb = jax.lax.dynamic_slice(v_cache, start, (1, s, block, n_kv, dv))[0]
    logits = jnp.einsum("skgd,stkd->skgt", qg, kb.astype(dtype), preferred_element_type=jnp.float32)
    visible = (j * block + jnp.arange(block))[None, :] <= positions[:, None]  # (S, block)
    return jnp.where(visible[:, None, None, :], logits, -jnp.inf), vb

  def step(j, carry):
    m, l, acc = carry
    logits, vb = scores(j)
    m_new = jnp.maximum(m, jnp.max(logits, axis=-1))  # finite: block 0 always holds position 0
    p = jnp.exp(logits - m_new[..., None])
    corr = jnp.exp(m - m_new)
    l = l * corr + jnp.sum(p, axis=-1)
    pv = jnp.einsum("skgt,stkd->skgd", p.astype(dtype), vb.astype(dtype), preferred_element_type=jnp.float32)
    return m_new, l, acc * corr[..., None] + pv

  init = (jnp.full((s, n_kv, g), -jnp.inf, jnp.float32), jnp.zeros((s, n_kv, g), jnp.float32),
          jnp.zeros((s, n_kv, g, dv), jnp.float32))
  _, l, acc = jax.lax.fori_loop(0, n_blocks, step, init)
  return acc / l[..., None]
