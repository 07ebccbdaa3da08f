"""The critic (value model): its own MaxText Qwen3 decoder + final norm + a scalar value head (paper §2.3).

Params::

    {"backbone": <the actor's params tree, own weights>,
     "value_head": {"kernel": (E,) float32, "bias": () float32}}

``values[b, t] = v(h_t)``, the value of the prefix *before* token t: the value head applied to the final-normed
hidden state at position t-1 (which has seen tokens 0..t-1 of the same segment). Position 0, the first token
of every packed segment and padding (segment 0) have no prefix and get 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rsi_jax.config import Config
from rsi_jax.models.actor import Backbone, valid_targets

HEAD_INIT_SCALE = 0.1  # kernel ~ N(0, (0.1/sqrt(E))^2): initial values ~ N(0, 0.01), small next to rewards


class Critic:
  """Value model V_φ. ``.backbone`` is a :class:`Backbone` (same MaxText config as the actor)."""

  def __init__(self, cfg: Config, mesh: Mesh | None = None, maxtext_config=None):
    self.backbone = Backbone(cfg, mesh, maxtext_config)
    self.cfg, self.mesh = cfg, self.backbone.mesh
    self.maxtext_config, self.model = self.backbone.maxtext_config, self.backbone.model
    emb = cfg.model.base_emb_dim
    rep = NamedSharding(self.mesh, PartitionSpec())
    self.head_shardings = {"kernel": rep, "bias": rep}
    self.param_shardings = {"backbone": self.backbone.param_shardings, "value_head": self.head_shardings}
    self.abstract_params = {
        "backbone": self.backbone.abstract_params,
        "value_head": {"kernel": jax.ShapeDtypeStruct((emb,), jnp.float32, sharding=rep),
                       "bias": jax.ShapeDtypeStruct((), jnp.float32, sharding=rep)}}
    self._head = jax.jit(self._head_impl, out_shardings=self.head_shardings)
    self._values = jax.jit(self._values_impl)

  def _head_impl(self, rng):
    e = self.cfg.model.base_emb_dim
    k = jax.random.normal(rng, (e,), jnp.float32) * (HEAD_INIT_SCALE / jnp.sqrt(e))
    return {"kernel": k, "bias": jnp.zeros((), jnp.float32)}

  def init(self, rng: jax.Array) -> dict:
    """Fresh backbone (MaxText init) and value head."""
    k1, k2 = jax.random.split(rng)
    return {"backbone": self.backbone.init(k1), "value_head": self._head(k2)}

  def init_from_actor(self, actor_params: dict, rng: jax.Array) -> dict:
    """Backbone copied from the actor's weights (a new buffer, resharded to the critic's shardings),
    fresh value head."""
    backbone = jax.tree.map(lambda x, s: jax.device_put(jnp.array(x, copy=True), s), actor_params,
                            self.backbone.param_shardings)
    return {"backbone": backbone, "value_head": self._head(rng)}

  def _values_impl(self, params, tokens, positions, segment_ids):
    h = self.backbone.final_hidden(params["backbone"], tokens, positions, segment_ids)
    head = params["value_head"]
    v = jnp.einsum("bte,e->bt", h.astype(jnp.float32), head["kernel"],
                   precision=jax.lax.Precision.HIGHEST) + head["bias"]
    # v(h_t) uses the state after tokens < t: shift right by one.
    v = jnp.pad(v[:, :-1], ((0, 0), (1, 0)))
    return jnp.where(valid_targets(segment_ids), v, 0.0)

  def values(self, params, tokens, positions, segment_ids) -> jax.Array:
    """(B, T) float32 values of the prefix before each token (0 at segment starts and padding)."""
    return self._values(params, tokens, positions, segment_ids)

  def values_fn(self):
    """The un-jitted pure function (params, tokens, positions, segment_ids) -> (B, T), for train steps."""
    return self._values_impl


def build_critic(cfg: Config, mesh: Mesh | None = None) -> Critic:
  return Critic(cfg, mesh)
