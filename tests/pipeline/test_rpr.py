"""The RPR update on the tiny MaxText Qwen3: critic-only steps leave the actor untouched, joint steps move
both, and at the start of an update (π_θ = π_old) the PPO loss is exactly −E[A] with nothing clipped."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rsi_jax.config import CONFIG_DIR, load_config
from rsi_jax.models import Actor, Critic, build_mesh
from rsi_jax.models.optim import TrainState
from rsi_jax.pipeline.rpr import RPRTrainer
from rsi_jax.rl.batch import Sample, assemble_batch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trainer():
  cfg = load_config(CONFIG_DIR / "smoke.yml", ["model.max_target_length=64", "rl.gamma_turn=0.95",
                                               "mesh.ici_fsdp_parallelism=2", "mesh.ici_tensor_parallelism=1",
                                               "rl.minibatches=1",
                                               "rl.lambda_turn=0.9"])
  mesh = build_mesh(cfg, jax.devices()[:2])
  actor, critic = Actor(cfg, mesh), Critic(cfg, mesh)
  a = actor.init(jax.random.key(0))
  c = critic.init_from_actor(a, jax.random.key(1))
  return RPRTrainer(cfg, actor, critic), a, c


def _batch():
  rng = np.random.default_rng(0)
  eps = []
  for e in range(3):
    n = 24 + 4 * e
    gen = np.zeros(n, bool)
    gen[8:14] = gen[18:n - 1] = True
    turns = np.where(np.arange(n) < 16, 0, 1)
    eps.append([Sample(rng.integers(0, 5000, n), gen, np.where(gen, -1.0, 0).astype(np.float32), turns, e)])
  crashed = [Sample(rng.integers(0, 5000, 20), np.ones(20, bool), np.zeros(20, np.float32), np.zeros(20, int), 3)]
  return assemble_batch(eps + [crashed], rewards=[1.0, 0.0, 0.4, 0.0], train_mask=[True, True, True, False],
                        pad_multiple=16)


def _fresh(trainer):
  tr, a, c = trainer  # steps donate their state: hand each test its own copies
  return tr, jax.tree.map(jnp.copy, a), jax.tree.map(jnp.copy, c)


def _same(a, b):
  return all(bool((x == y).all()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_critic_only_then_joint(trainer):
  tr, a0, c0 = _fresh(trainer)
  a_host, c_host = jax.device_get(a0), jax.device_get(c0)
  batch = _batch()
  state = tr.init_state(a0, c0, train_actor=False)
  state, m = tr.step(state, batch, train_actor=False)
  assert np.isfinite(m["loss"]) and "policy/loss" not in m
  assert _same(jax.device_get(state.actor), a_host), "critic-only step changed the actor"
  assert not _same(jax.device_get(state.critic), c_host), "critic-only step left the critic unchanged"
  # the sampler's logprobs (-1 here) are only compared, never trained on: the mismatch is |log π − (−1)|
  # over the generated tokens, from an independent forward of the actor
  lp = np.asarray(tr.actor.token_logprobs(a_host, batch.tokens, batch.positions, batch.segment_ids))
  g = batch.gen_mask > 0
  assert m["mismatch/abs_mean"] == pytest.approx(float(np.abs(lp[g] + 1).mean()), rel=1e-5)
  assert m["mismatch/tokens"] == int(g.sum()) and m["drift/tokens"] == 0 and m["staleness/max"] == 0
  # explained variance of the values TB-GAE used (before this step's update)
  from rsi_jax.rl.metrics import explained_variance
  prep = tr.prepare(TrainState(a_host, None, c_host), batch)
  ev = explained_variance(prep["old_values"], prep["returns"], batch.gen_mask)
  assert m["value/explained_variance"] == pytest.approx(float(ev), abs=1e-6)
  # the advantage scale over the generated tokens (the policy-gradient signal's size), from the same prep
  adv = np.asarray(prep["advantages"])[g].astype(np.float64)
  assert adv.std() > 0
  assert m["advantage_abs_mean"] == pytest.approx(float(np.abs(adv).mean()), rel=1e-5)
  assert m["advantage_std"] == pytest.approx(float(adv.std()), rel=1e-5)
  assert m["advantage_mean"] == pytest.approx(float(adv.mean()), rel=1e-5, abs=1e-7)

  state = tr.start_actor(state)
  c1 = jax.device_get(state.critic)
  state, m = tr.step(state, batch, train_actor=True)
  assert not _same(jax.device_get(state.actor), a_host) and not _same(jax.device_get(state.critic), c1)
  # first joint update: ρ = 1 everywhere, so nothing is clipped and L_π = −E_j[A] (sample-level)
  assert m["policy/clip_frac"] == 0.0 and m["policy/ratio_max"] == pytest.approx(1.0, abs=1e-5)
  assert m["policy/loss"] == pytest.approx(-_sample_mean_adv(tr, a_host, c1, batch), rel=1e-4, abs=1e-5)
  assert int(state.step) == 2


def _sample_mean_adv(tr, a, c, batch):
  prep = tr.prepare(TrainState(a, None, c), batch)
  adv, m = np.asarray(prep["advantages"]), batch.gen_mask
  rows = m.sum(1) > 0
  return float(((adv * m).sum(1)[rows] / m.sum(1)[rows]).mean())


def test_joint_step_needs_an_actor_optimizer(trainer):
  tr, a0, c0 = _fresh(trainer)
  state = tr.init_state(a0, c0, train_actor=False)
  with pytest.raises(ValueError, match="start_actor"):
    tr.step(state, _batch(), train_actor=True)


def test_later_updates_see_the_changed_policy(trainer):
  """Against one π_old, the first update has ρ = 1 exactly; a second PPO epoch sees the policy the first
  one made (ρ far from 1, extremes over the whole step), so the clip can bind."""
  from rsi_jax.config import with_overrides
  tr, a0, c0 = _fresh(trainer)
  cfg = with_overrides(tr.cfg, {"actor_optim": {"learning_rate": 1e-2}})
  one = RPRTrainer(cfg, tr.actor, tr.critic)
  state = one.start_actor(one.init_state(a0, c0, train_actor=False))
  _, m1 = one.step(state, _batch(), train_actor=True)
  assert m1["updates"] == 1
  assert abs(m1["policy/ratio_max"] - 1) < 1e-5 and abs(m1["policy/ratio_min"] - 1) < 1e-5
  tr, a0, c0 = _fresh(trainer)
  two = RPRTrainer(with_overrides(cfg, {"rl": {"ppo_epochs": 2}}), tr.actor, tr.critic)
  state = two.start_actor(two.init_state(a0, c0, train_actor=False))
  state, m2 = two.step(state, _batch(), train_actor=True)
  assert m2["updates"] == 2 and int(state.step) == 2
  assert max(m2["policy/ratio_max"] - 1, 1 - m2["policy/ratio_min"]) > 1e-2
  assert m2["policy/approx_kl"] > 1e-6
  # fewer trainable samples (3) than rl.minibatches (4): one sample per minibatch, not a stopped run
  step0 = int(state.step)
  state, m4 = RPRTrainer(with_overrides(tr.cfg, {"rl": {"minibatches": 4}}), tr.actor, tr.critic).step(
      state, _batch(), train_actor=True)
  assert m4["minibatches"] == 3 and m4["updates"] == 3 and int(state.step) == step0 + 3


def test_non_finite_update_is_skipped_counted_and_leaves_the_weights(trainer):
  """A NaN reward (a corrupted batch) makes the loss and gradients non-finite: the update is skipped, counted,
  and neither the weights nor the optimizer moments change (bit for bit)."""
  tr, a0, c0 = _fresh(trainer)
  state = tr.start_actor(tr.init_state(a0, c0, train_actor=False))
  before = jax.device_get((state.actor, state.critic, state.actor_opt, state.critic_opt))
  bad = _batch()
  bad.rewards[0, np.flatnonzero(bad.dones[0])[0]] = np.nan
  state, m = tr.step(state, bad, train_actor=True)
  assert m["skipped_updates"] == 1 and m["updates"] == 0  # made no update
  after = jax.device_get((state.actor, state.critic, state.actor_opt, state.critic_opt))
  assert jax.tree.structure(after) == jax.tree.structure(before)
  assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(after), jax.tree.leaves(before)))
  # the next good batch trains as usual
  state, m = tr.step(state, _batch(), train_actor=True)
  assert m["skipped_updates"] == 0 and not _same(jax.device_get(state.actor), before[0])


def test_minibatch_without_trainable_tokens_makes_no_update(trainer):
  """Every episode masked (infrastructure failures): no optimizer update at all (AdamW would otherwise still
  move the weights through weight decay), counted as empty."""
  tr, a0, c0 = _fresh(trainer)
  state = tr.start_actor(tr.init_state(a0, c0, train_actor=False))
  before = jax.device_get((state.actor, state.critic, state.actor_opt, state.critic_opt))
  b = _batch()
  masked = assemble_batch([[Sample(b.tokens[i], np.ones(len(b.tokens[i]), bool), b.sampler_logprobs[i],
                                   b.turn_ids[i], i)] for i in range(4)],
                          rewards=[0.0] * 4, train_mask=[False] * 4, pad_multiple=16)
  state, m = tr.step(state, masked, train_actor=True)
  assert m["empty_updates"] == 1 and m["updates"] == 0 and m["skipped_updates"] == 0
  after = jax.device_get((state.actor, state.critic, state.actor_opt, state.critic_opt))
  assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(after), jax.tree.leaves(before)))


def test_token_versions_split_mismatch_from_drift():
  from rsi_jax.pipeline.rpr import token_version_metrics
  b = _batch()
  versions = np.where(b.gen_mask > 0, 7, -1).astype(np.int32)
  rows_old = [0, 2]
  versions[rows_old] = np.where(b.gen_mask[rows_old] > 0, 6, -1)
  b = b._replace(weight_versions=versions)
  train = b.sampler_logprobs + np.where(versions == 7, 0.25, 0.0) + np.where(versions == 6, 2.0, 0.0)
  m = token_version_metrics(train.astype(np.float32), b, version=7)
  g = b.gen_mask > 0
  assert m["mismatch/abs_mean"] == pytest.approx(0.25) and m["drift/abs_mean"] == pytest.approx(2.0)
  assert m["mismatch/tokens"] + m["drift/tokens"] == int(g.sum())
  assert m["staleness/max"] == 1 and m["staleness/mean"] == pytest.approx(m["drift/tokens"] / g.sum())


def _varied_batch(n=6):
  rng = np.random.default_rng(5)
  eps = []
  for e in range(n):
    k = int(rng.integers(14, 34))
    gen = np.zeros(k, bool)
    gen[5:9] = gen[11:k - 1] = True
    turns = np.where(np.arange(k) < 10, 0, 1)
    eps.append([Sample(rng.integers(0, 5000, k), gen, np.where(gen, -1.0, 0).astype(np.float32), turns, e)])
  return assemble_batch(eps, rewards=list(rng.normal(size=n)), pad_multiple=16)


def test_packed_accumulated_step_equals_the_unpacked_step(trainer):
  """The same joint PPO step with one sample per row in one pass, and packed into rows of at most 48 tokens
  (2 shards, at most 2 samples a row, dynamic balancing) over several passes with float32 gradient
  accumulation: equal losses, metrics and gradient norms, for the actor and the critic; the SFT loss too."""
  from rsi_jax.config import with_overrides
  tr, a0, c0 = _fresh(trainer)
  batch = _varied_batch()
  runs = {}
  for name, over in (("unpacked", {"rl": {"per_device_token_budget": 0, "pad_multiple": 16},
                                   "pipeline": {"micro_batch": 0}}),
                     ("packed", {"rl": {"per_device_token_budget": 48, "pad_multiple": 16,
                                        "dynamic_balancing": True}, "pipeline": {"micro_batch": 2}})):
    one = RPRTrainer(with_overrides(tr.cfg, over), tr.actor, tr.critic)
    state = one.start_actor(one.init_state(jax.tree.map(jnp.copy, a0), jax.tree.map(jnp.copy, c0), False))
    runs[name] = one.step(state, batch, train_actor=True)[1]
  u, p = runs["unpacked"], runs["packed"]
  assert u["packing/passes"] == 1 and p["packing/passes"] >= 2 and p["packing/row_length"] == 48
  assert p["packing/efficiency"] > u["packing/efficiency"]
  for k in ("loss", "policy/loss", "value/loss", "value/value_mse", "policy/num_samples", "policy/num_tokens",
            "policy/ratio_mean", "actor_grad_norm", "critic_grad_norm", "advantage_mean",
            "value/explained_variance"):
    assert p[k] == pytest.approx(u[k], rel=2e-4, abs=1e-6), k
  assert u["policy/num_samples"] == 6

  # RSR's SFT loss through TrainStep.accumulate
  from rsi_jax.models.optim import init_train_state, make_optimizer, make_train_step, masked_nll_loss
  from rsi_jax.pipeline.rpr import sft_passes
  from rsi_jax.rl.metrics import combine_pass_metrics
  opt = make_optimizer(tr.cfg.actor_optim)
  step = make_train_step(tr.actor, opt, masked_nll_loss(tr.actor))
  out = {}
  for name, budget in (("unpacked", 0), ("packed", 48)):
    cfg = with_overrides(tr.cfg, {"rl": {"per_device_token_budget": budget, "pad_multiple": 16}})
    plan, passes = sft_passes(cfg, tr.actor.mesh, batch)
    assert len(plan.samples) == 6 and float(passes[0]["num_samples"]) == 6
    state = init_train_state(tr.actor, opt, jax.tree.map(jnp.copy, a0))
    _, loss, aux = step.accumulate(state, passes, combine=combine_pass_metrics)
    out[name] = (plan.passes, float(loss), float(aux["nll_per_token"]), float(aux["actor_grad_norm"]))
  assert out["unpacked"][0] == 1 and out["packed"][0] >= 2
  np.testing.assert_allclose(out["packed"][1:], out["unpacked"][1:], rtol=2e-4)
