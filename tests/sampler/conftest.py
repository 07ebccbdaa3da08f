"""Shared fixtures: one tiny actor and one compiled engine for the whole sampler test package.

The tiny Qwen3 (configs/models/qwen3-tiny.yml) runs with a 512-token vocabulary so decode steps are cheap;
the token embedding is scaled down so the random model's next-token distributions are spread out (sampled
tokens vary and their logprobs are far from 0, which makes the logprob comparisons meaningful).
"""

import jax
import pytest

from rsi_jax.config import load_config

VOCAB = 512
NUM_SLOTS = 4
MAX_PREFILL = 32
AR_CAPACITY = 24  # max_cache_length - max_prefill_length


@pytest.fixture(scope="session")
def cfg():
  return load_config(None, [
      f"model.vocab_size={VOCAB}", "model.max_target_length=128", "mesh.ici_fsdp_parallelism=4",
      "mesh.ici_tensor_parallelism=2", f"sampler.num_slots={NUM_SLOTS}",
      f"sampler.max_prefill_length={MAX_PREFILL}", "sampler.prefill_buckets=[8,16,32]",
      f"sampler.max_cache_length={MAX_PREFILL + AR_CAPACITY}"])


@pytest.fixture(scope="session")
def actor(cfg):
  from rsi_jax.models.actor import Actor
  from rsi_jax.models.mesh import build_mesh
  return Actor(cfg, build_mesh(cfg))


def _flatten(params, seed):
  """Random actor params with a down-scaled embedding (see the module docstring)."""
  params = jax.tree.map(lambda x: x, params)
  params["token_embedder"]["embedding"] = params["token_embedder"]["embedding"] * 0.1
  return params


@pytest.fixture(scope="session")
def actor_params(actor):
  return _flatten(actor.init(jax.random.key(0)), 0)


@pytest.fixture(scope="session")
def actor_params_b(actor):
  """A second, different set of weights (for hot-swap tests)."""
  return _flatten(actor.init(jax.random.key(1)), 1)


def engine_with(cfg, **sampler):
  """The engine for ``cfg`` with ``sampler`` section overrides."""
  from rsi_jax.config import with_overrides
  from rsi_jax.sampler.factory import build_engine
  return build_engine(with_overrides(cfg, {"sampler": sampler}))


@pytest.fixture(scope="session")
def engine(cfg):
  """The slot engine (per-slot cache, MaxText prefill)."""
  return engine_with(cfg, decode_impl="slot")


BLOCK = 8  # paged engine: positions per KV block (the 56-position sequence limit is 7 blocks)
CHUNK = 8  # paged engine: prompt tokens per prefill chunk


@pytest.fixture(scope="session")
def engine_paged(cfg):
  """The paged engine: blocks of 8 positions, prompts prefilled 8 tokens at a time (the default pool: the
  slot cache's memory, 4 slots x 7 blocks)."""
  return engine_with(cfg, decode_impl="paged", block_size=BLOCK, prefill_chunk=CHUNK)


@pytest.fixture(scope="session")
def engine_maxtext(cfg):
  """The reference decode path: MaxText's own autoregressive mode."""
  return engine_with(cfg, decode_impl="maxtext")
