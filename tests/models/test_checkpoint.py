"""Param-only Orbax checkpoints: actor and critic items, restored onto other shardings."""

import jax
import numpy as np
import pytest

from rsi_jax.config import load_config
from rsi_jax.models.actor import Actor
from rsi_jax.models.checkpoint import restore_params, save_params, saved_items
from rsi_jax.models.critic import Critic
from rsi_jax.models.mesh import build_mesh

TINY = ["model.vocab_size=256", "model.base_num_decoder_layers=1"]


@pytest.mark.slow
def test_roundtrip_onto_another_mesh(tmp_path):
  cfg_a = load_config(None, TINY + ["mesh.ici_fsdp_parallelism=4", "mesh.ici_tensor_parallelism=2"])
  actor_a = Actor(cfg_a, build_mesh(cfg_a))
  critic_a = Critic(cfg_a, actor_a.mesh)
  params = actor_a.init(jax.random.PRNGKey(0))
  cparams = critic_a.init_from_actor(params, jax.random.PRNGKey(1))
  save_params(tmp_path / "ckpt", actor=params, critic=cparams)
  save_params(tmp_path / "actor_only", actor=params)
  assert saved_items(tmp_path / "ckpt") == ("actor", "critic")
  assert saved_items(tmp_path / "actor_only") == ("actor",)

  cfg_b = load_config(None, TINY + ["mesh.ici_data_parallelism=2", "mesh.ici_fsdp_parallelism=4"])
  actor_b = Actor(cfg_b, build_mesh(cfg_b))
  critic_b = Critic(cfg_b, actor_b.mesh)
  out = restore_params(tmp_path / "ckpt", actor=actor_b.abstract_params, critic=critic_b.abstract_params)
  for got, want, sh in zip(jax.tree.leaves(out["actor"]), jax.tree.leaves(params),
                           jax.tree.leaves(actor_b.param_shardings)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert got.sharding == sh
  for got, want in zip(jax.tree.leaves(out["critic"]), jax.tree.leaves(cparams)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  only = restore_params(tmp_path / "ckpt", critic=critic_b.abstract_params)
  assert set(only) == {"critic"}
  with pytest.raises(FileNotFoundError, match="'critic'"):
    restore_params(tmp_path / "actor_only", critic=critic_b.abstract_params)


def test_hf_folder_to_orbax_checkpoint(tmp_path):
  import os

  from rsi_jax.models.from_hf import convert_hf_checkpoint
  from rsi_jax.models.hf_import import hf_to_maxtext_numpy

  hf = os.path.join(os.path.dirname(__file__), "fixtures", "hf_qwen3_untied")
  cfg = convert_hf_checkpoint(hf, tmp_path / "ckpt", load_config(None, ["mesh.ici_fsdp_parallelism=-1"]))
  assert saved_items(tmp_path / "ckpt") == ("actor", "critic")
  actor = Actor(cfg, build_mesh(cfg))
  critic = Critic(cfg, actor.mesh)
  out = restore_params(tmp_path / "ckpt", actor=actor.abstract_params, critic=critic.abstract_params)
  want = hf_to_maxtext_numpy(hf, actor.abstract_params)
  for got, w, c in zip(jax.tree.leaves(out["actor"]), jax.tree.leaves(want),
                       jax.tree.leaves(out["critic"]["backbone"])):
    np.testing.assert_array_equal(np.asarray(got), w)
    np.testing.assert_array_equal(np.asarray(c), w)
  assert out["critic"]["value_head"]["kernel"].shape == (cfg.model.base_emb_dim,)
