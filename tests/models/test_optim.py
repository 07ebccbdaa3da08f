"""Per-role optimizers: weight decay spares norm scales and biases (Megatron's default) unless configured; the
learning rate is constant (the paper's) or warms up and decays on a cosine, as configured."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

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


def _rates(o: OptimConfig, n: int) -> list[float]:
  """The rate of each of n updates, read off AdamW's step: a unit gradient on one weight, b1 = b2 = 0 (Adam's step
  is then lr × sign(g), up to eps), no clip, no decay."""
  import dataclasses
  opt = make_optimizer(dataclasses.replace(o, b1=0.0, b2=0.0, eps=1e-12, weight_decay=0.0, grad_clip=1e9))
  p = {"w": jnp.zeros(())}
  state, out = opt.init(p), []
  for _ in range(n):
    upd, state = opt.update({"w": jnp.ones(())}, state, p)
    out.append(-float(upd["w"]))
  return out


def test_constant_rate_is_the_papers_and_keeps_the_state_it_had():
  o = OptimConfig(learning_rate=0.1)
  np.testing.assert_allclose(_rates(o, 5), [0.1] * 5, rtol=1e-5)
  # no schedule count in the state: checkpoints written before schedules were configurable restore unchanged
  p = {"w": jnp.zeros(())}
  old = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(0.1, mask=decay_mask))
  assert jax.tree.structure(make_optimizer(o).init(p)) == jax.tree.structure(old.init(p))


def test_warmup_then_cosine_against_the_formula():
  lr, warm, total, floor = 0.2, 4, 12, 0.05
  got = _rates(OptimConfig(learning_rate=lr, schedule="cosine", warmup_steps=warm, decay_steps=total,
                           final_lr_fraction=floor), 16)
  want = []
  for t in range(16):  # update t uses the rate at count t (optax counts from 0)
    if t < warm:
      want.append(lr * t / warm)
    else:
      frac = min(t - warm, total - warm) / (total - warm)
      want.append(lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac))))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
  assert got[-1] == got[-2] and abs(got[-1] - lr * floor) < 1e-6  # held at the floor after decay_steps
  no_warmup = _rates(OptimConfig(learning_rate=lr, schedule="cosine", decay_steps=4), 5)  # a decay-only phase
  np.testing.assert_allclose(no_warmup, [lr * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * t / 4)))
                                         for t in (0, 1, 2, 3, 4)], rtol=1e-4)
  warm_only = _rates(OptimConfig(learning_rate=lr, warmup_steps=warm), 8)
  np.testing.assert_allclose(warm_only, [lr * t / warm for t in range(warm)] + [lr] * 4, rtol=1e-5, atol=1e-7)


def test_schedule_settings_that_would_be_ignored_are_refused():
  from rsi_jax.config import ConfigError
  with pytest.raises(ConfigError, match=r"actor_optim.decay_steps.*only schedule cosine decays"):
    load_config(None, ["actor_optim.decay_steps=100"])
  with pytest.raises(ConfigError, match=r"critic_optim.final_lr_fraction.*only schedule cosine"):
    load_config(None, ["critic_optim.final_lr_fraction=0.1"])
  with pytest.raises(ConfigError, match=r"actor_optim.decay_steps.*must be > warmup_steps \(50\), got 50"):
    load_config(None, ["actor_optim.schedule=cosine", "actor_optim.warmup_steps=50", "actor_optim.decay_steps=50"])
  with pytest.raises(ConfigError, match=r"actor_optim.schedule.*constant or cosine, got 'linear'"):
    load_config(None, ["actor_optim.schedule=linear"])
  cfg = load_config(None, ["actor_optim.schedule=cosine", "actor_optim.decay_steps=10"])
  assert cfg.actor_optim.schedule == "cosine" and cfg.critic_optim.schedule == "constant"


def test_schedule_label_names_the_course_the_lineage_records():
  assert OptimConfig().schedule_label() == "constant"
  assert OptimConfig(warmup_steps=50).schedule_label() == "warmup 50, then constant"
  assert OptimConfig(schedule="cosine", warmup_steps=50, decay_steps=600).schedule_label() == \
      "warmup 50, cosine to 0.01x at 600"
