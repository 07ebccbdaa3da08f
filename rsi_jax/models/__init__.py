"""rsi_jax.models: MaxText Qwen3 actor and critic on a device mesh, HF import, Orbax param checkpoints.

    cfg = config_for_hf("/path/Qwen3-0.6B", load_config("configs/smoke.yml"))   # or any Config
    mesh = build_mesh(cfg)                                   # MaxText axis names, sizes from cfg.mesh
    actor, critic = Actor(cfg, mesh), Critic(cfg, mesh)
    params = actor.initial_params(rng)                       # HF import when model.hf_path is set
    cparams = critic.init_from_actor(params, rng)            # backbone copy + fresh value head
    logp = actor.token_logprobs(params, tokens, positions, segment_ids)   # (B, T) float32, chunked
    v = critic.values(cparams, tokens, positions, segment_ids)            # (B, T) value of each prefix
    step = make_train_step(actor, make_optimizer(cfg.actor_optim), loss_fn, critic, make_optimizer(...))
    save_params(dir, actor=params, critic=cparams)

Heavy modules (MaxText, Orbax) load on first use of a name, so ``import rsi_jax.models`` stays cheap.
"""

import importlib

_EXPORTS = {
    "build_mesh": "mesh", "batch_sharding": "mesh", "MESH_AXES": "mesh",
    "Actor": "actor", "Backbone": "actor", "build_actor": "actor", "build_maxtext_config": "actor",
    "chunked_token_logprobs": "actor",
    "Critic": "critic", "build_critic": "critic",
    "load_hf_params": "hf_import", "config_for_hf": "hf_import", "read_hf_config": "hf_import",
    "HFImportError": "hf_import", "hf_logits": "from_hf", "convert_hf_checkpoint": "from_hf",
    "save_params": "checkpoint", "restore_params": "checkpoint", "saved_items": "checkpoint",
    "make_optimizer": "optim", "make_train_step": "optim", "init_train_state": "optim", "TrainState": "optim",
    "masked_nll_loss": "optim",
    "Tokenizer": "tokenizer", "ChatRenderer": "tokenizer", "load_tokenizer": "tokenizer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(f"rsi_jax.models.{_EXPORTS[name]}"), name)
  raise AttributeError(f"module 'rsi_jax.models' has no attribute {name!r}")
