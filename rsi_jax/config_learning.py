"""The learner's config sections: model, mesh, optimizers, RL, rollout and reward, each validating its own values.

Part of the schema (:mod:`rsi_jax.config_schema` holds the whole :class:`~rsi_jax.config_schema.Config`, which
has one of each); import them from :mod:`rsi_jax.config`.
"""

from __future__ import annotations

import dataclasses
import math
import re

from rsi_jax.config_checks import ConfigError, check


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A MaxText Qwen3 decoder. Field names are MaxText's own config keys, passed through to pyconfig."""
  name: str = "qwen3-tiny"
  decoder_block: str = "qwen3"
  base_emb_dim: int = 64
  base_num_query_heads: int = 4
  base_num_kv_heads: int = 2
  base_mlp_dim: int = 128
  base_num_decoder_layers: int = 2
  head_dim: int = 16
  vocab_size: int = 151936
  logits_via_embedding: bool = True  # tie_word_embeddings
  normalization_layer_epsilon: float = 1e-6
  rope_max_timescale: int = 1_000_000
  use_qk_norm: bool = True
  max_target_length: int = 512
  dtype: str = "float32"  # activation dtype
  weight_dtype: str = "float32"
  scan_layers: bool = True
  remat_policy: str = "full"
  attention: str = "dot_product"
  hf_path: str = ""  # local HF Qwen3 folder (config.json + *.safetensors) to import; "" = random init
  tokenizer_path: str = ""  # "" = the Qwen3 tokenizer shipped inside the maxtext package
  maxtext_overrides: dict = dataclasses.field(default_factory=dict)  # any further MaxText keys, verbatim
  # LM-head matmul for log-probs/logits: float32 (full-precision reference path) or the activation dtype
  # with float32 accumulation; the log-softmax is float32 either way.
  logits_dtype: str = "float32"

  def validate(self, p):
    for k in ("base_emb_dim", "base_num_query_heads", "base_num_kv_heads", "base_mlp_dim",
              "base_num_decoder_layers", "head_dim", "vocab_size", "max_target_length"):
      check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    check(self.base_num_query_heads % self.base_num_kv_heads == 0, f"{p}.base_num_kv_heads",
           f"must divide base_num_query_heads ({self.base_num_query_heads}), got {self.base_num_kv_heads}")
    for k in ("dtype", "weight_dtype"):
      check(getattr(self, k) in ("float32", "bfloat16", "float16"), f"{p}.{k}",
             f"must be float32/bfloat16/float16, got {getattr(self, k)!r}")
    check(self.normalization_layer_epsilon > 0, f"{p}.normalization_layer_epsilon", "must be > 0")
    check(self.logits_dtype in ("float32", "bfloat16"), f"{p}.logits_dtype",
           f"must be float32/bfloat16, got {self.logits_dtype!r}")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Device mesh in MaxText's terms. -1 on one ICI axis means: whatever the devices leave."""
  ici_data_parallelism: int = 1
  ici_fsdp_parallelism: int = -1
  ici_tensor_parallelism: int = 1
  ici_context_parallelism: int = 1
  dcn_data_parallelism: int = 1
  dcn_fsdp_parallelism: int = 1

  def validate(self, p):
    autos = [k for k, v in self.items() if v == -1]
    check(len(autos) <= 1, f"{p}.{autos[-1] if autos else ''}", "at most one mesh axis may be -1")
    for k, v in self.items():
      check(v == -1 or v >= 1, f"{p}.{k}", f"must be >= 1 or -1, got {v}")

  def items(self):
    return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]

  def batch_shards(self) -> int | None:
    """Number of shards the batch axis is split over (data x fsdp, ICI x DCN), None if an axis is auto."""
    v = [self.ici_data_parallelism, self.ici_fsdp_parallelism, self.dcn_data_parallelism,
         self.dcn_fsdp_parallelism]
    return None if -1 in v else math.prod(v)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW + global-norm clipping (paper App. A). Constant learning rate within a phase (the paper's), unless
  ``schedule: cosine``: a linear warmup over ``warmup_steps`` updates, then a cosine decay to
  ``final_lr_fraction`` × the rate at update ``decay_steps`` (warmup included), held there after. The count is
  the optimizer's own (its state, checkpointed with it): every phase starts its schedule anew."""
  learning_rate: float = 5e-7
  b1: float = 0.90
  b2: float = 0.98
  eps: float = 1e-8
  weight_decay: float = 0.10
  grad_clip: float = 1.0
  # false (Megatron's default, the paper's stack): norm scales and biases are not decayed
  decay_norms_and_biases: bool = False
  schedule: str = "constant"  # constant | cosine
  warmup_steps: int = 0  # linear warmup from 0 (either schedule)
  decay_steps: int = 0  # cosine: the update at which the rate reaches its floor (warmup included)
  final_lr_fraction: float = 0.01  # cosine: the floor, as a fraction of learning_rate

  def schedule_label(self) -> str:
    """The rate's course in words, for the lineage: ``constant``, ``warmup 50, then constant``, ``warmup 50,
    cosine to 0.01x at 600``."""
    warm = f"warmup {self.warmup_steps}, " if self.warmup_steps else ""
    if self.schedule == "cosine":
      return f"{warm}cosine to {self.final_lr_fraction:g}x at {self.decay_steps}"
    return f"{warm}then constant" if warm else "constant"

  def validate(self, p):
    check(self.learning_rate >= 0, f"{p}.learning_rate", f"must be >= 0, got {self.learning_rate}")
    check(self.schedule in ("constant", "cosine"), f"{p}.schedule",
          f"must be constant or cosine, got {self.schedule!r}")
    check(self.warmup_steps >= 0, f"{p}.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
    if self.schedule == "cosine":
      check(self.decay_steps > self.warmup_steps, f"{p}.decay_steps",
            f"schedule cosine decays over decay_steps updates, warmup included: must be > warmup_steps "
            f"({self.warmup_steps}), got {self.decay_steps}")
      check(0 <= self.final_lr_fraction <= 1, f"{p}.final_lr_fraction",
            f"must be in [0, 1], got {self.final_lr_fraction}")
    else:  # no dead settings: what only the cosine schedule reads is refused under the constant one
      check(self.decay_steps == 0, f"{p}.decay_steps",
            f"only schedule cosine decays; schedule is {self.schedule!r} (set schedule: cosine, or leave it 0)")
      check(self.final_lr_fraction == 0.01, f"{p}.final_lr_fraction",
            f"only schedule cosine decays to a floor; schedule is {self.schedule!r}")
    check(0 <= self.b1 < 1, f"{p}.b1", f"must be in [0, 1), got {self.b1}")
    check(0 <= self.b2 < 1, f"{p}.b2", f"must be in [0, 1), got {self.b2}")
    check(self.eps > 0, f"{p}.eps", f"must be > 0, got {self.eps}")
    check(self.weight_decay >= 0, f"{p}.weight_decay", f"must be >= 0, got {self.weight_decay}")
    check(self.grad_clip > 0, f"{p}.grad_clip", f"must be > 0, got {self.grad_clip}")


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """Credit assignment and PPO (paper §2.3–2.4, App. A)."""
  gamma_turn: float = 1.0
  lambda_turn: float = 1.0
  clip_low: float = 0.30
  clip_high: float = 5.00
  value_clip: float = 4.00
  logprob_chunk: int = 1024
  pad_multiple: int = 2048  # token rows are padded to a multiple of this (bounded set of compiled shapes)
  # PPO passes over one rollout batch: rows split into `minibatches` updates, repeated `ppo_epochs` times,
  # all against the same π_old / v_old. The paper (App. A: rollout batch = global batch) makes one optimizer
  # update per rollout step, the default; more minibatches / epochs (the ratio clip then binds from the
  # second update on) are a departure available by config.
  minibatches: int = 1
  ppo_epochs: int = 1
  # The learner's passes (rsi_jax/rl/packing.py): each device computes one row of at most this many tokens
  # per forward/backward pass, several samples (segments) packed into it with their own segment ids; a
  # sample longer than the budget has a row of its own. 0 = no packing: one sample per row
  per_device_token_budget: int = 8192
  # spread samples over the data shards by token count (longest first to the least loaded shard) and pack
  # rows first-fit decreasing; false: contiguous blocks of samples in order (paper: RPR-2 balances)
  dynamic_balancing: bool = False
  # TB-GAE's recurrence (rsi_jax/rl/linked_gae.py): scan (sequential lax.scan), associative
  # (lax.associative_scan, log depth) or auto (associative on accelerators, scan on CPU); same results
  gae_impl: str = "auto"

  def validate(self, p):
    check(self.gae_impl in ("scan", "associative", "auto"), f"{p}.gae_impl",
           f"must be 'scan', 'associative' or 'auto', got {self.gae_impl!r}")
    for k in ("minibatches", "ppo_epochs"):
      check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    for k in ("gamma_turn", "lambda_turn"):
      check(0 <= getattr(self, k) <= 1, f"{p}.{k}", f"must be in [0, 1], got {getattr(self, k)}")
    for k in ("clip_low", "clip_high", "value_clip"):
      check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    check(self.clip_low < 1, f"{p}.clip_low", f"must be < 1 (ratio floor 1-clip_low > 0), got {self.clip_low}")
    for k in ("logprob_chunk", "pad_multiple"):
      check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    check(self.per_device_token_budget >= 0, f"{p}.per_device_token_budget",
           f"must be >= 0 (0 = no packing), got {self.per_device_token_budget}")
    check(self.per_device_token_budget % self.pad_multiple == 0, f"{p}.per_device_token_budget",
           f"must be a multiple of rl.pad_multiple={self.pad_multiple} (rows are padded to it), got "
           f"{self.per_device_token_budget}")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  global_batch: int = 256  # trajectories used per rollout step
  requested: int = 288  # requested per step; the first global_batch to finish are used
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0  # 0 = off
  max_new_tokens: int = 8192  # per turn
  # longest prompt the sampler accepts (paper: 96,000); the engine bounds it too: sampler.max_cache_length - 1
  # (paged) or sampler.max_prefill_length (slot / maxtext). Longer prompts get sampler.prompt_overflow
  max_input_tokens: int = 96000
  responses_per_task: int = 1  # episodes per drawn task in a rollout step (consecutive request indices)
  # one-batch-ahead asynchrony (paper §3.1): the rollouts of step k+1 are collected while the learner trains
  # on step k; a sample whose tokens are more than this many actor updates old is not trained on.
  # 0 = synchronous (rollouts, then the update)
  max_staleness: int = 1
  # true: the used episodes are the first global_batch by request index (not by finishing time) and every
  # sampler request is seeded from (run.seed, phase, step, request index, turn), so a run killed and resumed
  # ends with the same weights as an uninterrupted one; false: the first global_batch to finish are used
  deterministic: bool = False

  def validate(self, p):
    check(self.global_batch > 0, f"{p}.global_batch", f"must be > 0, got {self.global_batch}")
    check(self.requested >= self.global_batch, f"{p}.requested",
           f"must be >= global_batch ({self.global_batch}), got {self.requested}")
    check(self.temperature >= 0, f"{p}.temperature", f"must be >= 0, got {self.temperature}")
    check(0 < self.top_p <= 1, f"{p}.top_p", f"must be in (0, 1], got {self.top_p}")
    check(self.top_k >= 0, f"{p}.top_k", f"must be >= 0, got {self.top_k}")
    check(self.max_new_tokens > 0, f"{p}.max_new_tokens", "must be > 0")
    check(self.max_input_tokens > 0, f"{p}.max_input_tokens", "must be > 0")
    check(self.responses_per_task > 0, f"{p}.responses_per_task", f"must be > 0, got {self.responses_per_task}")
    check(self.max_staleness >= 0, f"{p}.max_staleness", f"must be >= 0, got {self.max_staleness}")
    check(not (self.deterministic and self.max_staleness > 0), f"{p}.deterministic",
           "needs rollout.max_staleness=0 (with one-batch-ahead rollouts, which weights sample a token depends "
           "on timing)")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """FDR / SPR rewards from verifier reports (paper §2.2, App. B); see rsi_jax/rl/rewards.py, divisors.py."""
  kind: str = "fdr"  # fdr | spr
  fallback_divisor: float = 82.0  # for families without a divisor when no divisor_table is set
  calibration_quantile: float = 0.90
  divisor_table: str = ""  # path to a divisor table (JSON with provenance); "" = fallback for every family
  hygiene_patterns: tuple = ()  # regexes (re.search on the CTRF test name) of checks excluded from P and N
  # SPR recalibration between phases (offline). Rules in priority order: failure suppression, then long
  # low-reward; families with fewer than recalibration_min_samples trajectories keep their divisor.
  high_reward_failure_threshold: float = 0.5  # failures scoring at least this are "high-reward failures"
  high_reward_failure_share: float = 0.25  # family share of such failures that triggers suppression
  suppression_factor: float = 2.0  # divisor multiplier for failure suppression (paper: doubled)
  long_low_reward_turns: int = 40  # a family is "long" when its median turns reach this
  long_low_reward_mean: float = 0.25  # ... and "low-reward" when its mean reward is below this
  long_low_reward_factor: float = 0.25  # divisor multiplier for long low-reward families (paper: quartered)
  recalibration_min_samples: int = 5

  def validate(self, p):
    check(self.kind in ("fdr", "spr"), f"{p}.kind", f"must be 'fdr' or 'spr', got {self.kind!r}")
    check(self.fallback_divisor > 0, f"{p}.fallback_divisor", f"must be > 0, got {self.fallback_divisor}")
    check(0 < self.calibration_quantile <= 1, f"{p}.calibration_quantile", "must be in (0, 1]")
    for pat in self.hygiene_patterns:
      try:
        re.compile(pat)
      except (re.error, TypeError) as e:
        raise ConfigError(f"{p}.hygiene_patterns: {pat!r} is not a valid regex: {e}") from None
    check(self.high_reward_failure_threshold >= 0, f"{p}.high_reward_failure_threshold",
           f"must be >= 0, got {self.high_reward_failure_threshold}")
    check(0 <= self.high_reward_failure_share <= 1, f"{p}.high_reward_failure_share",
           f"must be in [0, 1], got {self.high_reward_failure_share}")
    check(self.long_low_reward_turns >= 0, f"{p}.long_low_reward_turns",
           f"must be >= 0, got {self.long_low_reward_turns}")
    check(self.long_low_reward_mean >= 0, f"{p}.long_low_reward_mean",
           f"must be >= 0, got {self.long_low_reward_mean}")
    for k in ("suppression_factor", "long_low_reward_factor"):
      check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    check(self.recalibration_min_samples >= 1, f"{p}.recalibration_min_samples",
           f"must be >= 1, got {self.recalibration_min_samples}")
