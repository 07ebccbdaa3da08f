"""Weights out: an actor checkpoint -> an HF Qwen3 folder (``config.json`` + ``model.safetensors``).

The inverse of :mod:`rsi_jax.models.hf_import` (its module docstring has the layout table): every MaxText
leaf becomes exactly one HF tensor per layer, transposed back for the linear kernels; a tied head stays tied
(``tie_word_embeddings: true``, no ``lm_head.weight``), an untied one is written as ``lm_head.weight``.
Tensors keep the dtype they were trained in. ``config.json`` is written by transformers' own
``Qwen3Config`` (no torch needed). An HF folder imported and exported again gives bitwise the same tensors.

  python -m rsi_jax.models.export --checkpoint=DIR --out=HF_DIR [--maxtext_out=DIR] [--config=FILE] [key=value ...]

``--maxtext_out`` also writes the weights as a MaxText parameter checkpoint (MaxText's own
``save_params_to_path``), which MaxText's ``load_parameters_path`` reads (e.g. to decode with MaxText).

``DIR`` is a checkpoint (``runs/<run>/checkpoints/<phase>/<step>``) or a phase folder (its newest step);
``--config`` defaults to the run's own ``config.yml`` found above the checkpoint. On the CPU the process gives
itself the virtual devices the config's mesh needs (unless ``XLA_FLAGS`` sets the count). Exit status 0
written, 2 (one line) for a usage or config error (before anything is read) or a checkpoint that does not
restore as written (corrupted, unreadable, of another model size).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import jax
import numpy as np
from absl import flags

from rsi_jax import cli
from rsi_jax.config import Config
from rsi_jax.models.hf_import import _LAYER_MAP, _TOP_MAP, _path_names

# MaxText kernels whose HF "in" dimension spans the first two axes (the rest: the first axis only)
_IN_AXES = {("self_attention", "out", "kernel"): 2}


def _to_hf(arr: np.ndarray, kind: str, names: tuple) -> np.ndarray:
  if kind != "linear":
    return arr
  a = _IN_AXES.get(names, 1)
  w = arr.reshape(int(np.prod(arr.shape[:a])), int(np.prod(arr.shape[a:])))
  return np.ascontiguousarray(w.T)  # MaxText (in, out...) -> HF Linear (out, in)


def maxtext_to_hf_numpy(params: dict, scan_axis: int = 1) -> dict[str, np.ndarray]:
  """HF tensor name -> numpy array for every leaf of a MaxText Qwen3 actor params tree (arrays anywhere)."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = _path_names(path)
    arr = np.asarray(jax.device_get(leaf))
    if names in _TOP_MAP:
      hf_name, kind = _TOP_MAP[names]
      out[hf_name] = _to_hf(arr, kind, names)
    elif names[:2] == ("decoder", "layers") and names[2:] in _LAYER_MAP:
      tmpl, kind = _LAYER_MAP[names[2:]]
      for l in range(arr.shape[scan_axis]):
        out[tmpl.format(l=l)] = _to_hf(np.take(arr, l, axis=scan_axis), kind, names[2:])
    else:
      raise ValueError(f"no HF tensor for MaxText param {'/'.join(map(str, names))} (not a Qwen3 actor tree?)")
  return out


def hf_config(cfg: Config, dtype: str) -> dict:
  """``config.json`` of the model ``cfg.model`` describes, written by transformers' ``Qwen3Config``."""
  from transformers import Qwen3Config
  m = cfg.model
  c = Qwen3Config(
      vocab_size=m.vocab_size, hidden_size=m.base_emb_dim, intermediate_size=m.base_mlp_dim,
      num_hidden_layers=m.base_num_decoder_layers, num_attention_heads=m.base_num_query_heads,
      num_key_value_heads=m.base_num_kv_heads, head_dim=m.head_dim, rms_norm_eps=m.normalization_layer_epsilon,
      max_position_embeddings=m.max_target_length, tie_word_embeddings=bool(m.logits_via_embedding),
      rope_parameters={"rope_type": "default", "rope_theta": float(m.rope_max_timescale)},
      architectures=["Qwen3ForCausalLM"], dtype=dtype)
  return c.to_dict()


def export_hf(params: dict, cfg: Config, out_dir: str, scan_axis: int = 1) -> Path:
  """Write ``params`` (the actor's tree) as an HF Qwen3 folder at ``out_dir``."""
  from safetensors.numpy import save_file
  if cfg.model.decoder_block != "qwen3" or not cfg.model.use_qk_norm:
    raise ValueError(f"HF export writes Qwen3 (decoder_block qwen3 with q/k norms), not "
                     f"{cfg.model.decoder_block!r}")
  tensors = maxtext_to_hf_numpy(params, scan_axis)
  tied = "lm_head.weight" not in tensors
  if tied != bool(cfg.model.logits_via_embedding):
    raise ValueError(f"the params are {'tied' if tied else 'untied'} but model.logits_via_embedding is "
                     f"{cfg.model.logits_via_embedding}: wrong config for this checkpoint")
  dtype = str(next(iter(tensors.values())).dtype)
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
  (out / "config.json").write_text(json.dumps(hf_config(cfg, dtype), indent=2, sort_keys=True) + "\n")
  return out


def export_maxtext(params: dict, out_dir: str) -> str:
  """Write ``params`` (the actor's tree) as a MaxText parameter-only checkpoint (``load_parameters_path``)."""
  from maxtext.common import checkpointing
  checkpointing.save_params_to_path(str(out_dir), {"params": params})  # Flax's "params" collection inside
  return str(out_dir)


def _run_config(checkpoint: str) -> str:
  """The ``config.yml`` of the run folder above ``checkpoint``."""
  p = Path(checkpoint).resolve()
  for parent in [p, *p.parents]:
    if (parent / "config.yml").is_file():
      return str(parent / "config.yml")
  raise FileNotFoundError(f"no config.yml above {checkpoint}: pass --config=FILE (the run's config)")


PROG = "python -m rsi_jax.models.export"
FLAGS = cli.flag_values()
flags.DEFINE_string("checkpoint", "", "Checkpoint (or phase folder) holding the item 'actor' (required).",
                    flag_values=FLAGS)
flags.DEFINE_string("out", "", "HF folder to write.", flag_values=FLAGS)
flags.DEFINE_string("maxtext_out", "", "MaxText parameter checkpoint to write (load_parameters_path).",
                    flag_values=FLAGS)
flags.DEFINE_string("config", "", "The run's config (default: config.yml above the checkpoint).", flag_values=FLAGS)


def main(argv=None) -> int:
  # transformers (imported for Qwen3Config and by MaxText) prints its notices on import: "PyTorch was not found"
  # (torch is not needed here) and other models' config warnings; errors still show
  os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
  overrides = cli.parse(FLAGS, argv, PROG, __doc__)
  from rsi_jax.config import ConfigError, load_config
  try:
    if not FLAGS.checkpoint:
      raise cli.UsageError("--checkpoint: required (a checkpoint or phase folder)")
    if not (FLAGS.out or FLAGS.maxtext_out):
      raise cli.UsageError("give --out (HF folder) and/or --maxtext_out (MaxText checkpoint)")
    cli.check_output_folder(FLAGS.out, "out")
    cli.check_output_folder(FLAGS.maxtext_out, "maxtext_out")
    cfg = load_config(FLAGS.config or _run_config(FLAGS.checkpoint), overrides)
  except (cli.UsageError, ConfigError, FileNotFoundError) as e:
    cli.fail(PROG, str(e))
  cli.provide_cpu_devices(cfg.mesh)  # before JAX starts its backends
  from rsi_jax.models.actor import Actor
  from rsi_jax.models.checkpoint import CheckpointError, restore_params
  from rsi_jax.models.mesh import build_mesh
  actor = Actor(cfg, build_mesh(cfg))
  try:
    params = restore_params(FLAGS.checkpoint, actor=actor.abstract_params)["actor"]
  except CheckpointError as e:  # corrupted, unreadable or of another model: one line, nothing written
    print(f"cannot load checkpoint: {e}", file=sys.stderr)
    return 2
  if FLAGS.out:
    out = export_hf(params, cfg, FLAGS.out, int(getattr(actor.maxtext_config, "param_scan_axis", 1)))
    print(f"wrote {out}: {len(os.listdir(out))} files ({cfg.model.name}, "
          f"{'tied' if cfg.model.logits_via_embedding else 'untied'} head)")
  if FLAGS.maxtext_out:
    print(f"wrote {export_maxtext(params, FLAGS.maxtext_out)} (MaxText load_parameters_path)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
