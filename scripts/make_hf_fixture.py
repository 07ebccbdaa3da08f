"""Build tiny random Qwen3 checkpoints with HF transformers and save them as test fixtures.

Each fixture folder holds what an HF Qwen3 folder holds (config.json, model.safetensors) plus the golden
float32 logits HF computes for fixed token rows (golden.npz: tokens (B, T) int32, logits (B, T, V) float32).
Our import + MaxText forward must reproduce them (tests/models/test_hf_parity.py).

Runs in its own Python 3.11 venv with the CPU torch wheel (not the project's environment):

    /root/.pyenv/versions/3.11.7/bin/python -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch==2.13.0 transformers==5.24.0 safetensors
    /tmp/hfvenv/bin/python scripts/make_hf_fixture.py tests/models/fixtures
"""

import json
import os
import sys

import numpy as np
import torch
import transformers

FIXTURES = {
    # tied embeddings, head_dim (32) != hidden / heads (16), GQA 2:1
    "hf_qwen3_tied": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                          intermediate_size=128, num_hidden_layers=2, vocab_size=512,
                          tie_word_embeddings=True, rope_theta=1_000_000.0),
    # untied LM head, GQA 3:1, head_dim == hidden / heads, other rope base
    "hf_qwen3_untied": dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=2, head_dim=8,
                            intermediate_size=96, num_hidden_layers=3, vocab_size=384,
                            tie_word_embeddings=False, rope_theta=10_000.0),
}


def build(spec: dict, seed: int) -> transformers.Qwen3ForCausalLM:
  spec = dict(spec)
  theta = spec.pop("rope_theta")
  cfg = transformers.Qwen3Config(**spec, rms_norm_eps=1e-6, max_position_embeddings=256,
                                 rope_parameters={"rope_type": "default", "rope_theta": theta},
                                 attention_bias=False, use_sliding_window=False, torch_dtype="float32")
  torch.manual_seed(seed)
  model = transformers.Qwen3ForCausalLM(cfg).float().eval()
  # Larger-than-default random weights (and non-unit norm scales) so every tensor visibly matters and the
  # greedy next tokens are well separated.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.copy_(0.15 * torch.randn_like(p))
  return model


def main(out_root: str):
  for i, (name, spec) in enumerate(FIXTURES.items()):
    out = os.path.join(out_root, name)
    model = build(spec, seed=i)
    model.save_pretrained(out, safe_serialization=True)
    rng = np.random.default_rng(100 + i)
    tokens = rng.integers(0, spec["vocab_size"], size=(3, 20)).astype(np.int32)
    with torch.no_grad():
      logits = model(torch.from_numpy(tokens).long()).logits.float().numpy()
    np.savez_compressed(os.path.join(out, "golden.npz"), tokens=tokens, logits=logits)
    with open(os.path.join(out, "README"), "w") as f:
      f.write(f"Random tiny Qwen3 from scripts/make_hf_fixture.py (transformers {transformers.__version__}, "
              f"torch {torch.__version__}).\n{json.dumps(spec)}\n")
    print(name, logits.shape, sorted(os.listdir(out)))


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "tests/models/fixtures")
