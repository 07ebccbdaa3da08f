"""HF Qwen3 folder (``config.json`` + ``*.safetensors``) -> the MaxText actor's param tree, sharded.

A pure conversion: it takes the abstract params and shardings of an actor someone else built; building models
from a folder (its logits, a checkpoint of it) is :mod:`rsi_jax.models.from_hf`.

Tensors are read with numpy (no torch) and each device receives only its own slice
(``jax.make_array_from_callback``), so the same code runs under ``jax.distributed`` with one process per host.
Each host reads its own copy of the folder; under several processes the hosts compare a CRC-32 of every
converted tensor before any is placed, and refuse to start when they differ (a global array built from two
checkpoints would be a silent mixture).

HF -> MaxText layout (per layer l; scanned layers stack l at MaxText's ``param_scan_axis`` = 1):

    model.embed_tokens.weight (V, E)                 -> token_embedder.embedding (V, E)
    model.norm.weight (E,)                           -> decoder.decoder_norm.scale
    lm_head.weight (V, E)  [untied only]             -> decoder.logits_dense.kernel = W^T (E, V)
    layers.l.input_layernorm.weight                  -> pre_self_attention_layer_norm.scale
    layers.l.post_attention_layernorm.weight         -> post_self_attention_layer_norm.scale
    layers.l.self_attn.{q,k,v}_proj.weight (N*D, E)  -> self_attention.{query,key,value}.kernel = W^T -> (E, N, D)
    layers.l.self_attn.o_proj.weight (E, H*D)        -> self_attention.out.kernel = W^T -> (H, D, E)
    layers.l.self_attn.{q,k}_norm.weight (D,)        -> self_attention.{query,key}_norm.scale
    layers.l.mlp.{gate,up}_proj.weight (M, E)        -> mlp.{wi_0,wi_1}.kernel = W^T (E, M)
    layers.l.mlp.down_proj.weight (E, M)             -> mlp.wo.kernel = W^T (M, E)
"""

from __future__ import annotations

import glob
import json
import os
import re
import zlib

import jax
import numpy as np

from rsi_jax.config import Config, with_overrides
from rsi_jax.distributed import gather_objects

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM",)


class HFImportError(ValueError):
  """The HF folder cannot be imported: unknown architecture, missing tensor, shape mismatch."""


# MaxText per-layer param path (inside decoder.layers) -> (HF name template, kind)
_LAYER_MAP = {
    ("pre_self_attention_layer_norm", "scale"): ("model.layers.{l}.input_layernorm.weight", "copy"),
    ("post_self_attention_layer_norm", "scale"): ("model.layers.{l}.post_attention_layernorm.weight", "copy"),
    ("self_attention", "query", "kernel"): ("model.layers.{l}.self_attn.q_proj.weight", "linear"),
    ("self_attention", "key", "kernel"): ("model.layers.{l}.self_attn.k_proj.weight", "linear"),
    ("self_attention", "value", "kernel"): ("model.layers.{l}.self_attn.v_proj.weight", "linear"),
    ("self_attention", "out", "kernel"): ("model.layers.{l}.self_attn.o_proj.weight", "linear"),
    ("self_attention", "query_norm", "scale"): ("model.layers.{l}.self_attn.q_norm.weight", "copy"),
    ("self_attention", "key_norm", "scale"): ("model.layers.{l}.self_attn.k_norm.weight", "copy"),
    ("mlp", "wi_0", "kernel"): ("model.layers.{l}.mlp.gate_proj.weight", "linear"),
    ("mlp", "wi_1", "kernel"): ("model.layers.{l}.mlp.up_proj.weight", "linear"),
    ("mlp", "wo", "kernel"): ("model.layers.{l}.mlp.down_proj.weight", "linear"),
}
_TOP_MAP = {
    ("token_embedder", "embedding"): ("model.embed_tokens.weight", "copy"),
    ("decoder", "decoder_norm", "scale"): ("model.norm.weight", "copy"),
    ("decoder", "logits_dense", "kernel"): ("lm_head.weight", "linear"),
}


# ----------------------------------------------------------------------------------------------- config


def read_hf_config(hf_dir: str) -> dict:
  """config.json of an HF Qwen3 folder, checked for what our MaxText Qwen3 can represent."""
  path = os.path.join(hf_dir, "config.json")
  if not os.path.exists(path):
    raise HFImportError(f"{hf_dir}: no config.json")
  try:
    with open(path) as f:
      c = json.load(f)
  except (OSError, UnicodeDecodeError) as e:
    raise HFImportError(f"{path}: cannot read: {e}") from None
  except json.JSONDecodeError as e:
    raise HFImportError(f"{path}: not valid JSON: {e}") from None
  if not isinstance(c, dict):
    raise HFImportError(f"{path}: not a JSON object")
  archs = c.get("architectures") or []
  missing = [k for k in ("hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers",
                         "vocab_size") if k not in c]
  if c.get("model_type") == "qwen3" and missing:
    raise HFImportError(f"{path}: lacks {', '.join(missing)}")
  if c.get("model_type") != "qwen3" or not any(a in SUPPORTED_ARCHITECTURES for a in archs):
    raise HFImportError(f"{path}: unknown architecture {archs or c.get('model_type')!r} "
                        f"(model_type {c.get('model_type')!r}); supported: {SUPPORTED_ARCHITECTURES}")
  rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
  if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
    raise HFImportError(f"{path}: rope scaling {rope!r} is not supported (only plain RoPE)")
  if c.get("use_sliding_window"):
    raise HFImportError(f"{path}: use_sliding_window=true is not supported")
  if c.get("attention_bias"):
    raise HFImportError(f"{path}: attention_bias=true is not supported by the MaxText qwen3 block")
  if c.get("hidden_act", "silu") != "silu":
    raise HFImportError(f"{path}: hidden_act {c.get('hidden_act')!r} is not supported (Qwen3 uses silu)")
  return c


def _rope_theta(c: dict) -> float:
  rope = c.get("rope_parameters") or {}
  return float(rope.get("rope_theta", c.get("rope_theta", 10_000.0)))


def model_overrides(hf_cfg: dict, tied: bool | None = None) -> dict:
  """Our ``model`` section keys for an HF Qwen3 config.json."""
  heads = hf_cfg["num_attention_heads"]
  if tied is None:
    tied = bool(hf_cfg.get("tie_word_embeddings", False))
  return {
      "decoder_block": "qwen3",
      "base_emb_dim": hf_cfg["hidden_size"],
      "base_num_query_heads": heads,
      "base_num_kv_heads": hf_cfg.get("num_key_value_heads", heads),
      "base_mlp_dim": hf_cfg["intermediate_size"],
      "base_num_decoder_layers": hf_cfg["num_hidden_layers"],
      "head_dim": hf_cfg.get("head_dim") or hf_cfg["hidden_size"] // heads,
      "vocab_size": hf_cfg["vocab_size"],
      "logits_via_embedding": tied,
      "normalization_layer_epsilon": float(hf_cfg.get("rms_norm_eps", 1e-6)),
      "rope_max_timescale": int(_rope_theta(hf_cfg)),
      "use_qk_norm": True,
  }


def config_for_hf(hf_dir: str, cfg: Config | None = None, **model_extra) -> Config:
  """``cfg`` (default: the schema defaults) with its model section set from the HF folder."""
  hf_cfg = read_hf_config(hf_dir)
  tensors = _TensorIndex(hf_dir)
  tied = hf_cfg.get("tie_word_embeddings")
  if tied is None:
    tied = "lm_head.weight" not in tensors.names
  ov = dict(model_overrides(hf_cfg, bool(tied)), hf_path=str(hf_dir), **model_extra)
  return with_overrides(cfg or Config(), {"model": ov})


# ----------------------------------------------------------------------------------------------- tensors


class _TensorIndex:
  """Lazy access to the tensors of all ``*.safetensors`` files in a folder (numpy, no torch)."""

  def __init__(self, hf_dir: str):
    self.files = sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")))
    if not self.files:
      raise HFImportError(f"{hf_dir}: no *.safetensors files")
    from safetensors import safe_open

    self._where = {}
    for f in self.files:
      try:
        with safe_open(f, framework="numpy") as h:
          for k in h.keys():
            self._where[k] = f
      except Exception as e:  # noqa: BLE001 - safetensors' own error types name no file
        raise HFImportError(f"{f}: not a readable safetensors file: {e}") from None
    self.names = set(self._where)
    self.hf_dir = hf_dir

  def get(self, name: str) -> np.ndarray:
    if name not in self._where:
      raise HFImportError(f"{self.hf_dir}: missing tensor {name!r} (have {len(self.names)} tensors, "
                          f"e.g. {sorted(self.names)[:3]})")
    from safetensors import safe_open

    with safe_open(self._where[name], framework="numpy") as h:
      return h.get_tensor(name)


def _convert(w: np.ndarray, kind: str, target_shape: tuple, hf_name: str) -> np.ndarray:
  """One HF tensor -> one MaxText tensor of ``target_shape`` (per layer)."""
  if kind == "linear":
    w = w.T  # HF Linear stores (out, in); MaxText kernels are (in, out...)
  if int(np.prod(w.shape)) != int(np.prod(target_shape)) or (kind == "copy" and w.shape != target_shape):
    raise HFImportError(f"shape mismatch for {hf_name}: HF {tuple(w.shape)} cannot become MaxText "
                        f"{tuple(target_shape)}")
  if kind == "linear" and not any(int(np.prod(target_shape[:a])) == w.shape[0]
                                  for a in range(1, len(target_shape))):
    raise HFImportError(f"shape mismatch for {hf_name}: HF {tuple(w.shape[::-1])} (out, in) does not split "
                        f"into MaxText {tuple(target_shape)}")
  return w.reshape(target_shape)


def _path_names(path) -> tuple:
  return tuple(getattr(k, "key", getattr(k, "name", str(k))) for k in path)


def hf_to_maxtext_numpy(hf_dir: str, abstract_params: dict, scan_axis: int = 1) -> dict:
  """Host (numpy) arrays for every leaf of ``abstract_params`` (a ShapeDtypeStruct tree from the actor)."""
  tensors = _TensorIndex(hf_dir)
  out_flat = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_params)[0]:
    names = _path_names(path)
    dtype = leaf.dtype
    if names in _TOP_MAP:
      hf_name, kind = _TOP_MAP[names]
      w = tensors.get(hf_name)
      if names[0] == "token_embedder" and w.shape[0] < leaf.shape[0]:  # MaxText vocab padded: zero rows
        w = np.concatenate([w, np.zeros((leaf.shape[0] - w.shape[0],) + w.shape[1:], w.dtype)])
      arr = _convert(w, kind, tuple(leaf.shape), hf_name)
    elif names[:2] == ("decoder", "layers") and names[2:] in _LAYER_MAP:  # scanned layers
      hf_tmpl, kind = _LAYER_MAP[names[2:]]
      n_layers = leaf.shape[scan_axis]
      per_layer = tuple(s for i, s in enumerate(leaf.shape) if i != scan_axis)
      arr = np.stack([_convert(tensors.get(hf_tmpl.format(l=l)), kind, per_layer, hf_tmpl.format(l=l))
                      for l in range(n_layers)], axis=scan_axis)
    elif len(names) > 2 and names[0] == "decoder" and re.fullmatch(r"layers_\d+", str(names[1])) \
        and names[2:] in _LAYER_MAP:  # unscanned layers
      l = int(str(names[1]).split("_")[1])
      hf_tmpl, kind = _LAYER_MAP[names[2:]]
      arr = _convert(tensors.get(hf_tmpl.format(l=l)), kind, tuple(leaf.shape), hf_tmpl.format(l=l))
    else:
      raise HFImportError(f"no HF tensor maps to MaxText param {'/'.join(map(str, names))}")
    out_flat[path] = np.asarray(arr, dtype=dtype)
  treedef = jax.tree_util.tree_structure(abstract_params)
  return jax.tree_util.tree_unflatten(treedef, [out_flat[p] for p, _ in
                                                jax.tree_util.tree_flatten_with_path(abstract_params)[0]])


def _check_model_matches(hf_dir: str, cfg: Config):
  want = model_overrides(read_hf_config(hf_dir), cfg.model.logits_via_embedding)
  for k, v in want.items():
    have = getattr(cfg.model, k)
    if k == "vocab_size":
      if have < v:
        raise HFImportError(f"model.vocab_size={have} is smaller than the HF vocab_size {v}")
      continue
    if k in ("normalization_layer_epsilon",):
      ok = abs(have - v) <= 1e-12
    else:
      ok = have == v
    if not ok:
      raise HFImportError(f"model.{k}={have!r} does not match the HF folder ({v!r}); "
                          f"build the config with rsi_jax.models.config_for_hf")


def check_hf_folder(hf_dir: str, cfg: Config) -> None:
  """What can be checked of an HF folder before any model is built (the training program's pre-flight):
  config.json readable and supported, matching ``cfg.model``, and every ``*.safetensors`` header readable.
  HFImportError names the file."""
  if not os.path.isdir(hf_dir):
    raise HFImportError(f"{hf_dir}: no such folder")
  _check_model_matches(hf_dir, cfg)
  _TensorIndex(hf_dir)


def load_hf_params(hf_dir: str, actor) -> dict:
  """Actor (or critic backbone) params from an HF Qwen3 folder, placed in ``actor.param_shardings``.

  ``actor`` must be built from a config matching the folder (see :func:`config_for_hf`). Under several JAX
  processes every host reads its own copy, and the import fails on every process (no process left waiting)
  when any host cannot read it or the hosts' tensors differ (:func:`check_hosts_agree`)."""
  try:
    _check_model_matches(hf_dir, actor.cfg)
    host = hf_to_maxtext_numpy(hf_dir, actor.abstract_params,
                               scan_axis=int(getattr(actor.maxtext_config, "param_scan_axis", 1)))
  except Exception as e:  # noqa: BLE001 - reported on every process, then raised here as it was
    check_hosts_agree(hf_dir, None, f"{type(e).__name__}: {e}")
    raise
  check_hosts_agree(hf_dir, host)
  return jax.tree.map(
      lambda a, s: jax.make_array_from_callback(a.shape, s, lambda idx, a=a: a[idx]), host,
      actor.param_shardings)


def tensor_checksums(host: dict) -> dict[str, int]:
  """CRC-32 of each host array's bytes, keyed by its param path (``a/b/c``)."""
  return {"/".join(map(str, _path_names(path))): zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1))
          for path, a in jax.tree_util.tree_flatten_with_path(host)[0]}


def check_hosts_agree(hf_dir: str, host: dict | None, error: str | None = None) -> None:
  """Under several JAX processes: raise :class:`HFImportError` on every process unless every one of them read
  the folder (``error``: why this one could not) and all read the same tensors (each host reads ``hf_dir``
  from its own disk). Processes are grouped by what they read, so the message names the odd ones out.
  One process: nothing to compare."""
  if jax.process_count() == 1:
    return
  views = gather_objects([(error, tensor_checksums(host) if host is not None else None)])
  failed = {i: e for i, (e, _) in enumerate(views) if e is not None}
  if failed:
    if error is not None:
      return  # this process raises its own error
    raise HFImportError(f"{hf_dir}: process(es) {sorted(failed)} could not import it (process "
                        f"{min(failed)}: {failed[min(failed)]})")
  groups: dict = {}
  for i, (_, sums) in enumerate(views):
    groups.setdefault(tuple(sorted(sums.items())), []).append(i)
  if len(groups) > 1:
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    (ref, ref_procs), (other, other_procs) = ranked[0], ranked[1]
    a, b = dict(ref), dict(other)
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    raise HFImportError(f"{hf_dir}: the hosts read different weights (processes grouped by what they read: "
                        f"{' / '.join(str(p) for _, p in ranked)}): {other_procs} differ from {ref_procs} in "
                        f"{len(differ)} of {len(set(a) | set(b))} tensors (first: {differ[0]}); every host needs "
                        f"the same checkpoint files")
