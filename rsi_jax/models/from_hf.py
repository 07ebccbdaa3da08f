"""Models built from an HF Qwen3 folder: its logits through our actor, and its conversion to a checkpoint."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rsi_jax.config import Config, with_overrides
from rsi_jax.models.actor import Actor
from rsi_jax.models.checkpoint import save_params
from rsi_jax.models.critic import Critic
from rsi_jax.models.hf_import import config_for_hf, load_hf_params
from rsi_jax.models.mesh import build_mesh


def hf_logits(hf_dir: str, tokens, cfg: Config | None = None, positions=None, segment_ids=None,
              actor=None) -> np.ndarray:
  """float32 logits (B, T, V) of an HF Qwen3 folder through our import path and our MaxText actor.

  Runs on one device by default (any batch size); pass ``cfg`` to choose mesh/dtype settings
  (its model section is replaced by the folder's), or a prebuilt ``actor``."""
  tokens = np.asarray(tokens, np.int32)
  if tokens.ndim == 1:
    tokens = tokens[None]
  b, t = tokens.shape
  if actor is None:
    one_device = cfg is None
    base = cfg or with_overrides(Config(), {"mesh": {"ici_fsdp_parallelism": 1}})
    cfg = config_for_hf(hf_dir, base, max_target_length=max(t, base.model.max_target_length))
    actor = Actor(cfg, build_mesh(cfg, jax.devices()[:1] if one_device else None))
  params = load_hf_params(hf_dir, actor)
  if positions is None:
    positions = np.broadcast_to(np.arange(t, dtype=np.int32), (b, t))
  if segment_ids is None:
    segment_ids = np.ones((b, t), np.int32)
  out = actor.logits(params, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segment_ids))
  if not out.is_fully_addressable:  # multi-host: rows live on other processes too
    from jax.experimental import multihost_utils

    out = multihost_utils.process_allgather(out, tiled=True)
  return np.asarray(jax.device_get(out), np.float32)


def convert_hf_checkpoint(hf_dir: str, out_dir: str, cfg: Config | None = None, with_critic: bool = True,
                          seed: int = 0) -> Config:
  """HF Qwen3 folder -> param-only Orbax checkpoint at ``out_dir`` with item ``actor`` (and ``critic``: the
  same backbone weights plus a fresh value head from ``seed``). Returns the config the checkpoint belongs to
  (``cfg`` with the folder's model section). Collective under multi-host: every process calls it."""
  cfg = config_for_hf(hf_dir, cfg)
  actor = Actor(cfg)
  params = load_hf_params(hf_dir, actor)
  critic_params = None
  if with_critic:
    critic_params = Critic(cfg, actor.mesh, actor.maxtext_config).init_from_actor(params,
                                                                                  jax.random.PRNGKey(seed))
  save_params(out_dir, actor=params, critic=critic_params)
  return cfg
