"""HF export: HF folder -> our actor -> HF folder is bitwise on every tensor (tied and untied heads), the
config is transformers' own and describes the same model, the exported folder imports back to HF's golden
logits, and the command line exports a real Orbax checkpoint of a run."""

import json
import os

import jax
import numpy as np
import pytest

from rsi_jax.config import Config, dump_config, with_overrides
from rsi_jax.models.actor import Actor
from rsi_jax.models.export import export_hf, main
from rsi_jax.models.from_hf import hf_logits
from rsi_jax.models.hf_import import config_for_hf, load_hf_params
from rsi_jax.models.mesh import build_mesh
from tests.models.test_hf_parity import ATOL, FIXTURES, NAMES, RTOL, _golden

MODEL_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "tie_word_embeddings",
              "rope_parameters", "model_type", "architectures", "hidden_act", "attention_bias")


def _tensors(folder):
  from safetensors import safe_open
  with safe_open(os.path.join(folder, "model.safetensors"), framework="numpy") as h:
    return {k: h.get_tensor(k) for k in h.keys()}


def _actor(name):
  cfg = config_for_hf(os.path.join(FIXTURES, name), with_overrides(Config(), {"mesh": {"ici_fsdp_parallelism": 1}}))
  actor = Actor(cfg, build_mesh(cfg, jax.devices()[:1]))
  return cfg, actor, load_hf_params(os.path.join(FIXTURES, name), actor)


def _same_folder(out, name):
  want, got = _tensors(os.path.join(FIXTURES, name)), _tensors(out)
  assert sorted(got) == sorted(want)
  for k in want:
    assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  hf = json.loads(open(os.path.join(FIXTURES, name, "config.json")).read())
  mine = json.loads(open(os.path.join(out, "config.json")).read())
  assert {k: mine.get(k) for k in MODEL_KEYS} == {k: hf.get(k) for k in MODEL_KEYS}


@pytest.mark.parametrize("name", NAMES)
def test_hf_to_ours_to_hf_is_bitwise_and_imports_back_to_the_golden_logits(name, tmp_path):
  cfg, actor, params = _actor(name)
  out = export_hf(params, cfg, str(tmp_path / "hf"))
  _same_folder(out, name)
  from transformers import AutoConfig
  assert type(AutoConfig.from_pretrained(out)).__name__ == "Qwen3Config"
  tokens, want = _golden(name)
  np.testing.assert_allclose(hf_logits(str(out), tokens), want, atol=ATOL, rtol=RTOL)


def test_export_refuses_a_config_that_does_not_match_the_params(tmp_path):
  cfg, _, params = _actor("hf_qwen3_tied")
  untied = with_overrides(cfg, {"model": {"logits_via_embedding": False}})
  with pytest.raises(ValueError, match="params are tied but model.logits_via_embedding is False"):
    export_hf(params, untied, str(tmp_path / "x"))


def test_command_line_exports_a_run_checkpoint(tmp_path):
  """A run folder (config.yml + an Orbax checkpoint of the actor): the CLI finds the config above the
  checkpoint, restores and writes the HF folder."""
  from rsi_jax.models.checkpoint import save_params
  cfg = config_for_hf(os.path.join(FIXTURES, "hf_qwen3_untied"))  # the default mesh: every (fake) device
  params = load_hf_params(os.path.join(FIXTURES, "hf_qwen3_untied"), Actor(cfg, build_mesh(cfg)))
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.yml").write_text(dump_config(cfg))
  save_params(str(run / "checkpoints" / "rpr1" / "3"), actor=params)
  main([f"--checkpoint={run / 'checkpoints' / 'rpr1'}", f"--out={tmp_path / 'hf'}",
        f"--maxtext_out={tmp_path / 'mt'}"])
  _same_folder(tmp_path / "hf", "hf_qwen3_untied")
  # MaxText's own parameter loading (what load_parameters_path runs) reads the same weights back
  from maxtext.common import checkpointing
  abstract = {"params": Actor(cfg, build_mesh(cfg)).abstract_params}
  got = checkpointing.load_params_from_path(str(tmp_path / "mt"), abstract, checkpoint_storage_concurrent_gb=4)
  got = got["params"]
  same = jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))), got, params)
  assert jax.tree.leaves(same) and all(jax.tree.leaves(same))
  # as a command (its own process): the same folder, and its console is its own line, without the notices
  # transformers prints on import ("PyTorch was not found", other models' config warnings)
  import subprocess
  import sys
  p = subprocess.run([sys.executable, "-m", "rsi_jax.models.export", f"--checkpoint={run / 'checkpoints' / 'rpr1'}",
                      f"--out={tmp_path / 'hf2'}"], env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                     text=True, timeout=600)
  assert p.returncode == 0, p.stderr[-3000:]
  assert p.stdout.startswith(f"wrote {tmp_path / 'hf2'}: 2 files"), p.stdout
  assert "[transformers]" not in p.stdout + p.stderr, p.stderr
  _same_folder(tmp_path / "hf2", "hf_qwen3_untied")
