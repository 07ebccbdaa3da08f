"""Actor / critic on 8 fake CPU devices: shardings from MaxText's logical rules, log-prob semantics, chunking,
padding, value head, and a sharded train step that matches one device and compiles once."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from rsi_jax.config import load_config
from rsi_jax.models.actor import Actor, param_specs
from rsi_jax.models.critic import Critic
from rsi_jax.models.mesh import batch_sharding, build_mesh
from rsi_jax.models.optim import init_train_state, make_optimizer, make_train_step, masked_nll_loss

V = 512
B, T = 8, 24
TINY = [f"model.vocab_size={V}", "model.max_target_length=64"]
MESHES = {
    "fsdp4_tensor2": ["mesh.ici_fsdp_parallelism=4", "mesh.ici_tensor_parallelism=2"],
    "data2_fsdp4": ["mesh.ici_data_parallelism=2", "mesh.ici_fsdp_parallelism=4"],
}

# Logical axes of each param (MaxText's Qwen3 layers) and where MaxText's base.yml rules put them on our mesh
# axes: embed -> fsdp, mlp / heads / vocab / norm -> tensor, the stacked layer axis -> replicated.
LOGICAL = {
    ("token_embedder", "embedding"): ("vocab", "embed"),
    ("decoder", "decoder_norm", "scale"): ("norm",),
    ("decoder", "logits_dense", "kernel"): ("embed", "vocab"),
    ("decoder", "layers", "mlp", "wi_0", "kernel"): ("embed", "layers", "mlp"),
    ("decoder", "layers", "mlp", "wi_1", "kernel"): ("embed", "layers", "mlp"),
    ("decoder", "layers", "mlp", "wo", "kernel"): ("mlp", "layers", "embed"),
    ("decoder", "layers", "pre_self_attention_layer_norm", "scale"): ("norm", "layers"),
    ("decoder", "layers", "post_self_attention_layer_norm", "scale"): ("norm", "layers"),
    ("decoder", "layers", "self_attention", "query", "kernel"): ("embed", "layers", "heads", None),
    ("decoder", "layers", "self_attention", "key", "kernel"): ("embed", "layers", "heads", None),
    ("decoder", "layers", "self_attention", "value", "kernel"): ("embed", "layers", "heads", None),
    ("decoder", "layers", "self_attention", "out", "kernel"): ("heads", "layers", None, "embed"),
    ("decoder", "layers", "self_attention", "query_norm", "scale"): ("norm", "layers"),
    ("decoder", "layers", "self_attention", "key_norm", "scale"): ("norm", "layers"),
}
RULES = {"embed": "fsdp", "mlp": "tensor", "heads": "tensor", "vocab": "tensor", "norm": "tensor"}


def _cfg(mesh_name, *extra):
  return load_config(None, TINY + MESHES[mesh_name] + list(extra))


@pytest.fixture(scope="module")
def built():
  cfg = _cfg("fsdp4_tensor2")
  mesh = build_mesh(cfg)
  actor = Actor(cfg, mesh)
  critic = Critic(cfg, mesh)
  params = actor.init(jax.random.PRNGKey(0))
  return cfg, mesh, actor, critic, params


def _batch(seed=1, b=B, t=T):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, V, (b, t)).astype(np.int32)
  positions = np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy()
  segs = np.ones((b, t), np.int32)
  return tokens, positions, segs


def _names(path):
  return tuple(k.key for k in path)


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_param_shardings_follow_logical_rules(mesh_name):
  cfg = _cfg(mesh_name, "model.logits_via_embedding=false")  # untied: logits_dense exists too
  mesh = build_mesh(cfg)
  actor = Actor(cfg, mesh)
  sizes = dict(mesh.shape)
  specs = param_specs(actor.param_shardings)
  flat = {_names(p): s for p, s in jax.tree_util.tree_flatten_with_path(
      specs, is_leaf=lambda x: isinstance(x, P))[0]}
  assert set(flat) == set(LOGICAL)
  for key, axes in LOGICAL.items():
    want = tuple(RULES.get(a) if RULES.get(a) and sizes[RULES[a]] > 1 else None for a in axes)
    got = tuple(flat[key]) + (None,) * (len(axes) - len(flat[key]))
    assert got == want, (key, got, want)


def test_initialised_params_live_in_their_shardings(built):
  _, mesh, actor, _, params = built
  specs = {_names(p): s for p, s in jax.tree_util.tree_flatten_with_path(
      param_specs(actor.param_shardings), is_leaf=lambda x: isinstance(x, P))[0]}
  assert set(specs) == set(LOGICAL) - {("decoder", "logits_dense", "kernel")}  # tied
  for key, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, specs[_names(key)]), leaf.ndim), _names(key)
  emb = params["token_embedder"]["embedding"]
  assert emb.sharding.shard_shape(emb.shape) == (V // 2, 64 // 4)  # vocab over tensor, embed over fsdp


def test_logprobs_are_log_softmax_of_logits_and_chunking_is_exact(built):
  _, _, actor, _, params = built
  tokens, pos, segs = _batch()
  logits = np.asarray(actor.logits(params, tokens, pos, segs))
  assert logits.shape == (B, T, V) and logits.dtype == np.float32
  # independent reference: numpy log-softmax in float64 of the full logits
  x = logits.astype(np.float64)
  ref = x - x.max(-1, keepdims=True)
  ref = ref - np.log(np.exp(ref).sum(-1, keepdims=True))
  want = np.zeros((B, T))
  want[:, 1:] = np.take_along_axis(ref[:, :-1], tokens[:, 1:, None], -1)[..., 0]
  full = np.asarray(actor.token_logprobs(params, tokens, pos, segs))  # default chunk 1024: one chunk
  np.testing.assert_allclose(full, want, rtol=1e-6, atol=1e-4)
  assert np.all(full[:, 0] == 0)
  # 23 predictions in chunks of 5: four full chunks and an uneven last one
  np.testing.assert_allclose(np.asarray(actor.token_logprobs(params, tokens, pos, segs, chunk=5)), full,
                             rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("case", ["fsdp4_tensor2", "fsdp2_context2_tensor2_bf16"])
def test_embedding_lookup_equals_maxtexts_own(built, case):
  """``Backbone.embed`` (the lookup with explicit shardings) gives MaxText's ``Embed`` rows bitwise, and the
  decoder's hidden states equal those of MaxText's own lookup, gradients included: float32 on fsdp x tensor,
  and bfloat16 activations under context parallelism (the case the explicit shardings are for)."""
  if case == "fsdp4_tensor2":
    _, _, actor, _, params = built
  else:
    cfg = load_config(None, TINY + ["mesh.ici_fsdp_parallelism=2", "mesh.ici_context_parallelism=2",
                                    "mesh.ici_tensor_parallelism=2", "model.dtype=bfloat16"])
    actor = Actor(cfg, build_mesh(cfg))
    assert dict(actor.mesh.shape)["context"] == 2
    params = actor.init(jax.random.PRNGKey(0))
  tokens, pos, segs = _batch()
  with actor._rules():
    own = jax.jit(lambda p, t: actor.merge(p).token_embedder(t))(params, tokens)
  ours = jax.jit(actor.embed)(params, tokens)
  want_dtype = jnp.float32 if case == "fsdp4_tensor2" else jnp.bfloat16
  assert ours.shape == (B, T, actor.cfg.model.base_emb_dim) and ours.dtype == own.dtype == want_dtype
  np.testing.assert_array_equal(np.asarray(ours), np.asarray(own))
  table = np.asarray(params["token_embedder"]["embedding"])
  np.testing.assert_array_equal(np.asarray(ours)[3, 5], table[tokens[3, 5]].astype(want_dtype))

  def maxtext_hidden(p, t):  # the decoder doing its own lookup
    with actor._rules():
      model = actor.merge(p)
      _, h, _ = model.decoder(shared_embedding=model.token_embedder, decoder_input_tokens=t, decoder_positions=pos,
                              decoder_segment_ids=segs, deterministic=True, model_mode="train")
      return model.decoder.decoder_norm(h)

  def total(fn):
    return jax.jit(jax.value_and_grad(lambda p: (fn(p, tokens).astype(jnp.float32) ** 2).sum()))(params)

  (v_ref, g_ref), (v, g) = total(maxtext_hidden), total(lambda p, t: actor.final_hidden(p, t, pos, segs))
  np.testing.assert_allclose(float(v), float(v_ref), rtol=1e-6)
  emb_ref, emb = g_ref["token_embedder"]["embedding"], g["token_embedder"]["embedding"]
  assert float(jnp.abs(emb_ref).max()) > 0
  np.testing.assert_allclose(np.asarray(emb), np.asarray(emb_ref), rtol=1e-5, atol=1e-6)


def test_chunked_gradient_equals_unchunked(built):
  _, _, actor, _, params = built
  tokens, pos, segs = _batch(2)

  def g(chunk):
    f = actor.token_logprobs_fn(chunk=chunk)
    return jax.jit(jax.grad(lambda p: f(p, tokens, pos, segs).sum()))(params)

  a, b = g(None), g(5)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)


def test_target_index_lists_each_rows_positions_in_a_power_of_two_width():
  from rsi_jax.models.actor import target_index
  mask = np.zeros((3, 40), bool)
  mask[0, [3, 4, 5, 30]] = True
  mask[1, 10:27] = True  # 17 positions: width 32
  idx = target_index(mask)
  assert idx.shape == (3, 32) and idx.dtype == np.int32
  assert list(idx[0, :5]) == [3, 4, 5, 30, 0] and list(idx[1, :17]) == list(range(10, 27))
  assert not idx[2].any() and not idx[1, 17:].any()
  assert target_index(mask[:1]).shape == (1, 16)  # at least 16
  assert target_index(np.ones((2, 40))).shape == (2, 40)  # at most T


def test_logprobs_at_loss_positions_equal_the_full_computation(built):
  """index=: the LM head only at the listed positions; those entries (values and gradients of a loss that reads
  only them) equal the full computation, every other entry is 0. Packed rows: a segment's first token (no
  prediction within its segment) stays 0 even when listed."""
  from rsi_jax.models.actor import target_index
  _, _, actor, _, params = built
  tokens, pos, segs = _batch(4)
  segs = segs.copy()
  segs[:, 14:] = 2  # two segments per row, the second starting at 14
  pos = pos.copy()
  pos[:, 14:] -= 14
  segs[1, 20:] = 0  # a padded tail
  rng = np.random.default_rng(5)
  mask = rng.random((B, T)) < 0.3
  mask[0, 14] = True  # a segment start: no prediction
  mask[1, 21] = True  # padding: no prediction
  idx = target_index(mask, minimum=4)
  full = np.asarray(actor.token_logprobs(params, tokens, pos, segs))
  at = np.asarray(actor.token_logprobs(params, tokens, pos, segs, chunk=3, index=idx))
  np.testing.assert_allclose(at, np.where(mask, full, 0.0), rtol=1e-6, atol=1e-5)
  assert at[0, 14] == 0 and at[1, 21] == 0 and np.count_nonzero(at) == np.count_nonzero(mask & (full != 0))
  w = jnp.asarray(rng.normal(size=(B, T)) * mask, jnp.float32)
  f = actor.token_logprobs_fn()
  g_full = jax.jit(jax.grad(lambda p: (f(p, tokens, pos, segs) * w).sum()))(params)
  g_at = jax.jit(jax.grad(lambda p: (f(p, tokens, pos, segs, index=idx) * w).sum()))(params)
  for x, y in zip(jax.tree.leaves(g_full), jax.tree.leaves(g_at)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)


def test_padding_and_packing_never_leak(built):
  _, _, actor, critic, params = built
  cparams = critic.init_from_actor(params, jax.random.PRNGKey(3))
  tokens, pos, segs = _batch(1)
  lp = np.asarray(actor.token_logprobs(params, tokens, pos, segs))
  vals = np.asarray(critic.values(cparams, tokens, pos, segs))
  # Right-pad each row to T+6 with garbage tokens in segment 0: real entries must not change.
  pad_tok = np.concatenate([tokens, np.full((B, 6), 7, np.int32)], 1)
  pad_pos = np.concatenate([pos, np.zeros((B, 6), np.int32)], 1)
  pad_seg = np.concatenate([segs, np.zeros((B, 6), np.int32)], 1)
  lp_p = np.asarray(actor.token_logprobs(params, pad_tok, pad_pos, pad_seg))
  np.testing.assert_allclose(lp_p[:, :T], lp, rtol=1e-6, atol=1e-4)
  assert np.all(lp_p[:, T:] == 0)
  v_p = np.asarray(critic.values(cparams, pad_tok, pad_pos, pad_seg))
  np.testing.assert_allclose(v_p[:, :T], vals, atol=1e-5)
  assert np.all(v_p[:, T:] == 0)
  # Pack the first h tokens of rows i and i+1 as two segments (+ padding) of one row. Causality: the first h
  # entries of an unpacked row are those of its length-h prefix, so packing must reproduce them exactly,
  # including 0 at the second segment's start.
  h = T // 2
  nxt = np.roll(np.arange(B), -1)
  pk_tok = np.concatenate([tokens[:, :h], tokens[nxt, :h], np.full((B, 6), 7, np.int32)], 1)
  pk_pos = np.concatenate([pos[:, :h], pos[:, :h], np.zeros((B, 6), np.int32)], 1)
  pk_seg = np.concatenate([np.ones((B, h)), 2 * np.ones((B, h)), np.zeros((B, 6))], 1).astype(np.int32)
  lp_pk = np.asarray(actor.token_logprobs(params, pk_tok, pk_pos, pk_seg))
  np.testing.assert_allclose(lp_pk[:, :h], lp[:, :h], rtol=1e-6, atol=1e-4)
  np.testing.assert_allclose(lp_pk[:, h:2 * h], lp[nxt, :h], rtol=1e-6, atol=1e-4)
  v_pk = np.asarray(critic.values(cparams, pk_tok, pk_pos, pk_seg))
  np.testing.assert_allclose(v_pk[:, h:2 * h], vals[nxt, :h], atol=1e-5)


def test_critic_values_and_gradient_reach_backbone(built):
  _, _, actor, critic, params = built
  cp = critic.init_from_actor(params, jax.random.PRNGKey(5))
  # backbone copied, not aliased
  for x, y in zip(jax.tree.leaves(cp["backbone"]), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  tokens, pos, segs = _batch(6)
  v = np.asarray(critic.values(cp, tokens, pos, segs))  # same shape as before: no new compile
  assert v.shape == (B, T) and v.dtype == np.float32 and np.all(v[:, 0] == 0)
  # v[t] is the head applied to the final-normed hidden state at t-1 (independent recomputation)
  h = np.asarray(jax.jit(critic.backbone.final_hidden)(cp["backbone"], tokens, pos, segs), np.float64)
  k = np.asarray(cp["value_head"]["kernel"], np.float64)
  np.testing.assert_allclose(v[:, 1:], h[:, :-1] @ k + float(cp["value_head"]["bias"]), atol=1e-5)
  g = jax.jit(jax.grad(lambda p: (critic.values_fn()(p, tokens, pos, segs) ** 2).sum()))(cp)
  for path, leaf in jax.tree_util.tree_flatten_with_path(g["backbone"])[0]:
    if "logits_dense" in jax.tree_util.keystr(path):
      continue
    assert float(jnp.abs(leaf).max()) > 0, jax.tree_util.keystr(path)
  fresh = critic.init(jax.random.PRNGKey(9))
  assert jax.tree.structure(fresh) == jax.tree.structure(cp)


def _joint_loss(actor, critic):
  nll = masked_nll_loss(actor)
  values = critic.values_fn()

  def loss_fn(a, c, batch):
    l1, _ = nll(a, None, batch)
    v = values(c, batch["tokens"], batch["positions"], batch["segment_ids"])
    l2 = ((v - batch["returns"]) ** 2 * batch["mask"]).sum() / batch["mask"].sum()
    return l1 + l2, {"nll": l1, "value": l2}

  return loss_fn


def _run_steps(cfg, mesh, params, batch_np, n=2):
  actor, critic = Actor(cfg, mesh), Critic(cfg, mesh)
  params = jax.device_put(params, actor.param_shardings)
  cparams = critic.init_from_actor(params, jax.random.PRNGKey(11))
  opt, copt = make_optimizer(cfg.actor_optim), make_optimizer(cfg.critic_optim)
  step = make_train_step(actor, opt, _joint_loss(actor, critic), critic=critic, critic_optimizer=copt)
  state = init_train_state(actor, opt, params, critic, copt, cparams)
  batch = {k: jax.device_put(v, batch_sharding(mesh, v.ndim)) for k, v in batch_np.items()}
  losses = []
  for _ in range(n):
    state, loss, aux = step(state, batch)
    losses.append(float(loss))
  return losses, step, state


def make_batch(seed=8):
  tokens, pos, segs = _batch(seed)
  segs[:, -3:] = 0  # some padding
  mask = (segs > 0).astype(np.float32)
  mask[:, :4] = 0
  returns = np.random.default_rng(seed).normal(size=(B, T)).astype(np.float32)
  return {"tokens": tokens, "positions": pos, "segment_ids": segs, "mask": mask, "returns": returns}


LR = ["actor_optim.learning_rate=1e-3", "critic_optim.learning_rate=1e-3"]


@pytest.fixture(scope="module")
def one_device_losses(built):
  """Reference: the same three joint steps on one device."""
  host = jax.device_get(built[4])
  cfg1 = load_config(None, TINY + ["mesh.ici_fsdp_parallelism=1"] + LR)
  losses, _, _ = _run_steps(cfg1, build_mesh(cfg1, devices=jax.devices()[:1]), host, make_batch(), n=3)
  return host, losses


@pytest.mark.slow
@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_sharded_train_step_matches_one_device_and_compiles_once(mesh_name, one_device_losses):
  host, losses1 = one_device_losses
  cfg = load_config(None, TINY + MESHES[mesh_name] + LR)
  losses8, step, state = _run_steps(cfg, build_mesh(cfg), host, make_batch(), n=3)
  assert step._cache_size() == 1  # steps 2 and 3 reused step 1's executable
  assert int(state.step) == 3
  np.testing.assert_allclose(losses8, losses1, rtol=2e-5)
  assert losses8[2] < losses8[0]  # the updates did something


def test_optimizer_is_clipped_adamw():
  cfg = load_config(None, ["actor_optim.grad_clip=0.5", "actor_optim.weight_decay=0.0",
                           "actor_optim.learning_rate=0.1"])
  opt = make_optimizer(cfg.actor_optim)
  p = {"w": jnp.ones(4)}
  g = {"w": jnp.full(4, 10.0)}
  upd, _ = opt.update(g, opt.init(p), p)
  ref_opt = optax.adamw(0.1, b1=0.9, b2=0.98, eps=1e-8, weight_decay=0.0)
  clipped = {"w": g["w"] * 0.5 / float(jnp.linalg.norm(g["w"]))}
  ref, _ = ref_opt.update(clipped, ref_opt.init(p), p)
  np.testing.assert_allclose(np.asarray(upd["w"]), np.asarray(ref["w"]), rtol=1e-6)


@pytest.mark.slow
def test_critic_only_step_freezes_the_actor(built):
  """RPR phases start with critic-only updates (paper App. A): the actor's weights must not move."""
  cfg, mesh, actor, critic, params = built
  cfg = load_config(None, TINY + MESHES["fsdp4_tensor2"] + LR)
  copt = make_optimizer(cfg.critic_optim)
  cparams = critic.init_from_actor(params, jax.random.PRNGKey(2))
  step = make_train_step(actor, None, _joint_loss(actor, critic), critic=critic, critic_optimizer=copt,
                         train_actor=False, donate=False)
  state = init_train_state(actor, None, params, critic, copt, cparams, train_actor=False)
  batch = {k: jax.device_put(v, batch_sharding(mesh, v.ndim)) for k, v in make_batch().items()}
  new, _, aux = step(state, batch)
  new, _, aux = step(new, batch)
  assert step._cache_size() == 1 and "actor_grad_norm" not in aux and float(aux["critic_grad_norm"]) > 0
  for a, b in zip(jax.tree.leaves(new.actor), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  moved = [float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(new.critic["value_head"]),
                                                        jax.tree.leaves(cparams["value_head"]))]
  assert max(moved) > 0
