"""Per-role optimizers: weight decay spares norm scales and biases (Megatron's default) unless configured."""

import jax
import jax.numpy as jnp
import numpy as np

from rsi_jax.config import OptimConfig, load_config
from rsi_jax.models.optim import decay_mask, make_optimizer


def _params():
  return {"decoder": {"layers": {"pre_self_attention_layer_norm": {"scale": jnp.ones(4)},
                                 "self_attention": {"query": {"kernel": jnp.ones((4, 4))},
                                                    "query_norm": {"scale": jnp.ones(4)}}},
                      "decoder_norm": {"scale": jnp.ones(4)}},
          "token_embedder": {"embedding": jnp.ones((8, 4))},
          "value_head": {"kernel": jnp.ones((4, 1)), "bias": jnp.ones(1)}}


def _step(decay_all: bool):
  opt = make_optimizer(OptimConfig(learning_rate=0.1, weight_decay=0.5, decay_norms_and_biases=decay_all))
  p = _params()
  upd, _ = opt.update(jax.tree.map(jnp.zeros_like, p), opt.init(p), p)  # zero gradients: decay only
  return jax.tree.map(lambda u: bool(np.any(np.asarray(u) != 0)), upd)


def test_decay_spares_norms_and_biases_by_default():
  moved = _step(decay_all=False)
  assert moved["decoder"]["layers"]["self_attention"]["query"]["kernel"]
  assert moved["token_embedder"]["embedding"] and moved["value_head"]["kernel"]
  assert not moved["decoder"]["layers"]["pre_self_attention_layer_norm"]["scale"]
  assert not moved["decoder"]["layers"]["self_attention"]["query_norm"]["scale"]
  assert not moved["decoder"]["decoder_norm"]["scale"] and not moved["value_head"]["bias"]
  assert all(jax.tree.leaves(_step(decay_all=True)))


def test_decay_mask_on_the_real_qwen3_tree():
  from rsi_jax.models import Actor, Critic, build_mesh
  cfg = load_config(None, ["mesh.ici_fsdp_parallelism=1"])
  mesh = build_mesh(cfg, jax.devices()[:1])
  for model in (Actor(cfg, mesh), Critic(cfg, mesh)):
    flat = jax.tree_util.tree_flatten_with_path(decay_mask(model.abstract_params))[0]
    names = {jax.tree_util.keystr(p): on for p, on in flat}
    norms = [k for k in names if "norm" in k]
    assert norms and not any(names[k] for k in norms)
    assert any(on for k, on in names.items() if "kernel" in k or "embedding" in k)
    assert all(on for k, on in names.items() if k.endswith("['kernel']") and "norm" not in k)
