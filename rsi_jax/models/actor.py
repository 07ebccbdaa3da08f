"""The actor: MaxText's own Qwen3 ``Transformer`` (NNX), sharded on a mesh from construction.

Params are the MaxText model's ``nnx.Param`` state as a plain nested dict of arrays, exactly
``nnx.to_pure_dict(nnx.state(actor.model, nnx.Param))``::

    {"token_embedder": {"embedding": (V, E)},
     "decoder": {"decoder_norm": {"scale": (E,)},
                 "layers": {...scanned: every leaf has the layer axis at MaxText's param_scan_axis (1)...},
                 "logits_dense": {"kernel": (E, V)}}}        # only with untied embeddings

so the same dict drives the MaxText model in any of its modes (train, prefill, autoregressive) via
``nnx.update(model, params)`` or :meth:`Backbone.merge`.

Log-probabilities and logits are computed from the final-normed hidden state and the LM-head weights in float32
(``model.logits_dtype``), chunked along the sequence so the full (B, T, V) logits never exist at once.
"""

from __future__ import annotations

import functools
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.linen import partitioning as nn_partitioning
from jax.sharding import Mesh, NamedSharding

from rsi_jax.config import Config
from rsi_jax.models.mesh import MESH_AXES, build_mesh, resolve_parallelism

MODEL_MODE_TRAIN = "train"

# Qwen3 facts that are not in our config (MaxText's configs/models/qwen3-*.yml).
_QWEN3_FIXED = {
    "mlp_activations": ["silu", "linear"],  # SwiGLU
    "normalize_embedding_logits": False,  # Qwen3's tied head is a plain x @ E^T
    "enable_dropout": False,
    "dropout_rate": 0.0,
}


def maxtext_kwargs(cfg: Config, mesh: Mesh | None = None) -> dict:
  """The MaxText pyconfig keys for ``cfg.model`` and the mesh (sizes taken from ``mesh`` when given)."""
  m = cfg.model
  kw = dict(_QWEN3_FIXED)
  for k in ("decoder_block", "base_emb_dim", "base_num_query_heads", "base_num_kv_heads", "base_mlp_dim",
            "base_num_decoder_layers", "head_dim", "vocab_size", "logits_via_embedding",
            "normalization_layer_epsilon", "rope_max_timescale", "use_qk_norm", "max_target_length", "dtype",
            "weight_dtype", "scan_layers", "remat_policy", "attention"):
    kw[k] = getattr(m, k)
  if mesh is not None:
    shape = dict(mesh.shape)
    ici = {"ici_data_parallelism": shape["data"], "ici_fsdp_parallelism": shape["fsdp"],
           "ici_tensor_parallelism": shape["tensor"], "ici_context_parallelism": shape["context"]}
  else:
    ici_r, _ = resolve_parallelism(cfg, jax.device_count())
    ici = {"ici_data_parallelism": ici_r["ici_data_parallelism"],
           "ici_fsdp_parallelism": ici_r["ici_fsdp_parallelism"],
           "ici_tensor_parallelism": ici_r["ici_tensor_parallelism"],
           "ici_context_parallelism": ici_r["ici_context_parallelism"]}
  # MaxText's mesh knobs as a whole (the mesh itself is ours, built by build_mesh): DCN folded into ICI
  # sizes so MaxText's own checks see the full device count on one "slice".
  kw.update(ici)
  kw.update({"dcn_data_parallelism": 1, "dcn_fsdp_parallelism": 1, "num_slices": 1})
  kw.update({
      "run_name": cfg.run.name,
      "per_device_batch_size": 1,
      "skip_jax_distributed_system": True,  # the caller owns jax.distributed
      "enable_checkpointing": False,
      "log_config": False,
      "jax_cache_dir": "",  # no global persistent-cache side effect
      "tokenizer_type": "huggingface",
      # context parallelism (mesh.ici_context_parallelism) on batches in natural token order: MaxText's
      # load-balanced path assumes its input pipeline permuted the sequence, which ours does not
      "context_parallel_load_balance": False,
      "base_output_directory": os.path.join(cfg.run.output_dir, "maxtext"),
  })
  kw.update({k: _thaw(v) for k, v in m.maxtext_overrides.items()})
  return kw


def _thaw(v):
  if isinstance(v, tuple):
    return [_thaw(x) for x in v]
  if hasattr(v, "items"):
    return {k: _thaw(x) for k, x in v.items()}
  return v


def build_maxtext_config(cfg: Config, mesh: Mesh | None = None, **extra):
  """MaxText's ``pyconfig.HyperParameters`` for our config (+ ``extra`` MaxText keys)."""
  from maxtext.configs import pyconfig  # heavy import, only when a model is built

  base = os.path.join(os.path.dirname(pyconfig.__file__), "base.yml")
  kw = maxtext_kwargs(cfg, mesh)
  kw.update(extra)
  return pyconfig.initialize(["", base], **kw)


class Backbone:
  """A MaxText Qwen3 ``Transformer`` on ``mesh``: abstract model, param shardings and a functional forward.

  Shared by :class:`Actor` and the critic (each with its own weights)."""

  def __init__(self, cfg: Config, mesh: Mesh | None = None, maxtext_config=None):
    from maxtext.utils import model_creation_utils

    if not cfg.model.scan_layers:
      # MaxText's unscanned NNX decoder updates its layers' RNG counters in place during the forward, which a
      # functional (params in, values out) forward cannot host; the scanned decoder is MaxText's training path.
      raise ValueError("model.scan_layers: the actor/critic need scanned layers (true)")
    if cfg.model.attention == "cudnn_flash_jax":
      # MaxText's cuDNN path (training mode) applies a causal mask only and drops segment ids.
      warnings.warn("model.attention=cudnn_flash_jax ignores segment ids: packed rows would attend across "
                    "segments (right padding alone is safe)", stacklevel=2)
    self.cfg = cfg
    self.mesh = build_mesh(cfg) if mesh is None else mesh
    if tuple(self.mesh.axis_names) != MESH_AXES:
      raise ValueError(f"mesh axes must be MaxText's {MESH_AXES}, got {self.mesh.axis_names}")
    self.maxtext_config = maxtext_config or build_maxtext_config(cfg, self.mesh)
    self.logical_axis_rules = self.maxtext_config.logical_axis_rules
    self._create_fn_for = functools.partial(model_creation_utils.get_nnx_create_model_fn,
                                            self.maxtext_config, self.mesh)
    _, self.model = model_creation_utils.create_nnx_abstract_model(self.maxtext_config, self.mesh)
    self.graphdef, abs_params, self._rest = nnx.split(self.model, nnx.Param, ...)
    self._param_treedef = jax.tree_util.tree_structure(abs_params)
    self.abstract_params = nnx.to_pure_dict(abs_params)  # ShapeDtypeStructs carrying their shardings
    self.param_shardings = jax.tree.map(lambda a: a.sharding, self.abstract_params)
    self.tied = bool(cfg.model.logits_via_embedding)
    mc = self.maxtext_config
    self._own_lookup = not (mc.use_iota_embed or mc.parameter_memory_host_offload
                            or str(getattr(mc.shard_mode, "value", mc.shard_mode)).lower() == "explicit")
    self._init = jax.jit(self._init_impl, out_shardings=self.param_shardings)

  # -- params
  def _init_impl(self, rng):
    model = self._create_fn_for(rng_key=rng)()
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))

  def init(self, rng: jax.Array) -> dict:
    """Fresh MaxText-initialised params, created directly in their shardings (no host copy)."""
    with self._rules():
      return self._init(rng)

  def initial_params(self, rng: jax.Array) -> dict:
    """The run's starting weights: imported from ``model.hf_path`` when set, else a fresh MaxText init."""
    if self.cfg.model.hf_path:
      from rsi_jax.models.hf_import import load_hf_params

      return load_hf_params(self.cfg.model.hf_path, self)
    return self.init(rng)

  def merge(self, params: dict) -> nnx.Module:
    """The MaxText Transformer holding ``params`` (use inside jit)."""
    leaves = jax.tree_util.tree_leaves(params)
    state = jax.tree_util.tree_unflatten(self._param_treedef, leaves)
    return nnx.merge(self.graphdef, state, self._rest)

  def _rules(self):
    return nn_partitioning.axis_rules(self.logical_axis_rules)

  # -- forward
  def final_hidden(self, params, tokens, positions, segment_ids):
    """Final-normed hidden states h (B, T, E) in the activation dtype (MaxText's decoder + decoder_norm).

    Segment id 0 marks padding: MaxText's attention mask only lets a token attend to earlier tokens of the
    same segment, so real tokens never see pads (and packed sequences never see each other)."""
    with self._rules():
      model = self.merge(params)
      # The decoder also computes MaxText's own logits; unused here, XLA drops them.
      _, hidden, _ = model.decoder(shared_embedding=model.token_embedder, decoder_input_tokens=tokens,
                                   decoder_positions=positions, decoder_segment_ids=segment_ids,
                                   deterministic=True, model_mode=MODEL_MODE_TRAIN,
                                   decoder_input_embeddings=self.embed(params, tokens) if self._own_lookup else None)
      return model.decoder.decoder_norm(hidden)

  def embed(self, params, tokens) -> jax.Array:
    """Token embeddings (B, T, E) in the activation dtype: the rows MaxText's ``Embed`` looks up, with the
    table's shardings made explicit.

    MaxText gathers from the table as stored: vocabulary over ``tensor``, features over fsdp (+ context).
    With context parallelism the token ids are split over (fsdp, context) too, and XLA's SPMD partitioner
    cannot reconcile the two: it copies the whole batch's embeddings to every device ("Involuntary full
    rematerialization", once per forward pass, ``tests/models/test_sharding_hygiene.py``). Here the table is
    first all-gathered over its feature dimension -- the all-gather FSDP makes of every weight before use --
    leaving the vocabulary split over ``tensor``; each device gathers the ids of its own (batch, sequence)
    shard from its vocabulary slice and the slices are summed, so the result is sharded like the activations
    that follow it. (MaxText variants this lookup does not reproduce -- ``use_iota_embed``, parameters offloaded
    to host memory, explicit sharding mode -- keep MaxText's own: ``_own_lookup`` is False for them.)"""
    table = params["token_embedder"]["embedding"].astype(self.maxtext_config.dtype)
    table = jax.lax.with_sharding_constraint(table, self._logical_sharding(("vocab", None)))
    out = table.at[tokens].get()
    return jax.lax.with_sharding_constraint(out, self._logical_sharding(
        ("activation_embed_and_logits_batch", "activation_length", "activation_embed")))

  def _logical_sharding(self, axes) -> NamedSharding:
    return NamedSharding(self.mesh, nn_partitioning.logical_to_mesh_axes(axes, self.logical_axis_rules))

  def head_weight(self, params) -> jax.Array:
    """LM head as (E, V): the transposed embedding when tied, else MaxText's logits_dense kernel."""
    return lm_head_weight(params, self.tied)


def lm_head_weight(params, tied: bool) -> jax.Array:
  """LM head as (E, V) from a MaxText Qwen3 params dict: the transposed embedding when tied, else the
  logits_dense kernel. Shared by the learner and the sampler so their logits are computed identically."""
  if tied:
    return params["token_embedder"]["embedding"].T
  return params["decoder"]["logits_dense"]["kernel"]


def project_logits(h, w, logits_dtype) -> jax.Array:
  """h (..., E) @ w (E, V) -> float32 logits. float32: both operands float32 at full precision (the
  reference path); otherwise ``logits_dtype`` operands with float32 accumulation (faster on TPU/GPU)."""
  if jnp.dtype(logits_dtype) == jnp.float32:
    return jnp.matmul(h.astype(jnp.float32), w.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
  return jnp.matmul(h.astype(logits_dtype), w.astype(logits_dtype), preferred_element_type=jnp.float32)


def valid_targets(segment_ids: jax.Array) -> jax.Array:
  """(B, T) bool: position t has a prediction from t-1 in the same (non-pad) segment; entry 0 is False."""
  same = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] != 0)
  return jnp.pad(same, ((0, 0), (1, 0)))


class Actor(Backbone):
  """Policy π_θ: MaxText Qwen3 with its LM head (paper §2.1). See the module docstring for the params tree."""

  def __init__(self, cfg: Config, mesh: Mesh | None = None, maxtext_config=None):
    super().__init__(cfg, mesh, maxtext_config)
    self.logits_dtype = jnp.dtype(cfg.model.logits_dtype)
    self.default_chunk = cfg.rl.logprob_chunk
    self._logits = jax.jit(self._logits_impl)
    self._logprobs = jax.jit(self._token_logprobs_impl, static_argnames=("chunk",))

  # -- logits
  def _project(self, h, w):
    """h (..., E) @ w (E, V) -> float32 logits (:func:`project_logits` with ``model.logits_dtype``)."""
    return project_logits(h, w, self.logits_dtype)

  def _logits_impl(self, params, tokens, positions, segment_ids):
    h = self.final_hidden(params, tokens, positions, segment_ids)
    return self._project(h, self.head_weight(params))

  def logits(self, params, tokens, positions, segment_ids) -> jax.Array:
    """Full float32 logits (B, T, V); entry t predicts token t+1. For parity checks and short inputs."""
    return self._logits(params, tokens, positions, segment_ids)

  # -- log-probabilities
  def _token_logprobs_impl(self, params, tokens, positions, segment_ids, chunk=None, index=None):
    h = self.final_hidden(params, tokens, positions, segment_ids)
    w = self.head_weight(params)
    if index is None:
      return chunked_token_logprobs(h, w, tokens, segment_ids, chunk or self.default_chunk, self._project)
    return gathered_token_logprobs(h, w, tokens, segment_ids, index, chunk or self.default_chunk, self._project)

  def token_logprobs(self, params, tokens, positions, segment_ids, chunk: int | None = None,
                     index=None) -> jax.Array:
    """(B, T) float32: entry t = log π(tokens[t] | tokens[<t]) within its segment.

    0 where no such prediction exists: t = 0, the first token of each segment, and padding (segment 0).
    Computed ``chunk`` positions at a time (default ``rl.logprob_chunk``); each chunk's logits are
    recomputed in the backward pass instead of stored. ``index`` (B, K) int (:func:`target_index`): only
    those positions are computed (the LM head runs on K rows per sequence instead of T), every other entry
    is 0 -- for losses that read only the generated tokens."""
    return self._logprobs(params, tokens, positions, segment_ids, chunk=chunk, index=index)

  def token_logprobs_fn(self, chunk: int | None = None):
    """The un-jitted pure function (params, tokens, positions, segment_ids, index=None) -> (B, T), for
    train steps."""
    return functools.partial(self._token_logprobs_impl, chunk=chunk)


def _rows_logprobs(hs, ys, w, chunk: int, project) -> jax.Array:
  """log softmax(hs[:, n] @ w)[ys[:, n]] for hs (B, N, E), ys (B, N): float32 (B, N), ``chunk`` rows of
  logits at a time."""
  b, n, e = hs.shape
  chunk = max(1, min(chunk, n))
  n_chunks = -(-n // chunk)
  pad = n_chunks * chunk - n
  hs = jnp.pad(hs, ((0, 0), (0, pad), (0, 0))).reshape(b, n_chunks, chunk, e).swapaxes(0, 1)  # (C, B, c, E)
  ys = jnp.pad(ys, ((0, 0), (0, pad))).reshape(b, n_chunks, chunk).swapaxes(0, 1)

  @jax.checkpoint  # keep only (B, chunk) per chunk for the backward pass, never (B, chunk, V)
  def one(args):
    hc, yc = args
    logits = project(hc, w)  # (B, chunk, V) float32
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, yc[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - lse

  lp = jax.lax.map(one, (hs, ys)) if n_chunks > 1 else one((hs[0], ys[0]))[None]
  return lp.swapaxes(0, 1).reshape(b, n_chunks * chunk)[:, :n]


def chunked_token_logprobs(h, w, tokens, segment_ids, chunk: int, project) -> jax.Array:
  """log softmax(h[:, t-1] @ w)[tokens[:, t]] for t >= 1, in float32, ``chunk`` positions at a time.

  Args: h (B, T, E) final-normed hidden; w (E, V) LM head; tokens, segment_ids (B, T) int.
  Returns (B, T) float32, 0 where :func:`valid_targets` is False."""
  b, t, _ = h.shape
  if t <= 1:
    return jnp.zeros((b, t), jnp.float32)
  lp = jnp.pad(_rows_logprobs(h[:, :-1], tokens[:, 1:], w, chunk, project), ((0, 0), (1, 0)))
  return jnp.where(valid_targets(segment_ids), lp, 0.0)


def gathered_token_logprobs(h, w, tokens, segment_ids, index, chunk: int, project) -> jax.Array:
  """:func:`chunked_token_logprobs` at the positions ``index`` (B, K) only (entries < 1 are padding): the
  LM head runs on K rows per sequence. Returns (B, T) float32, 0 at every other position; equal to the full
  computation at the indexed positions."""
  b, t, _ = h.shape
  if t <= 1:
    return jnp.zeros((b, t), jnp.float32)
  at = jnp.clip(index, 1, t - 1).astype(jnp.int32)
  valid = (index >= 1) & jnp.take_along_axis(valid_targets(segment_ids), at, axis=1)
  hs = jnp.take_along_axis(h, (at - 1)[..., None], axis=1)  # (B, K, E): the state that predicts token at
  lp = jnp.where(valid, _rows_logprobs(hs, jnp.take_along_axis(tokens, at, axis=1), w, chunk, project), 0.0)
  return jnp.zeros((b, t), jnp.float32).at[jnp.arange(b)[:, None], at].add(lp)


def target_index(mask: np.ndarray, minimum: int = 16) -> np.ndarray:
  """(B, K) int32 for ``token_logprobs(..., index=)``: per row, the positions where ``mask`` (B, T) is set,
  in order, padded with 0. K is the largest row count rounded up to a power of two (at least ``minimum``,
  at most T), so a phase compiles a handful of shapes."""
  mask = np.asarray(mask) > 0
  b, t = mask.shape
  k = max(int(mask.sum(1).max(initial=0)), 1)
  k = min(max(minimum, 1 << (k - 1).bit_length()), t)
  out = np.zeros((b, k), np.int32)
  for i in range(b):
    pos = np.flatnonzero(mask[i])
    out[i, :len(pos)] = pos
  return out


def build_actor(cfg: Config, mesh: Mesh | None = None) -> Actor:
  return Actor(cfg, mesh)


def param_specs(shardings) -> dict:
  """PartitionSpecs of a shardings tree (for tests and logs)."""
  return jax.tree.map(lambda s: s.spec, shardings, is_leaf=lambda s: isinstance(s, NamedSharding))
