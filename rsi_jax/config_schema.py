"""The configuration schema: one frozen dataclass per section, each validating its own values.

Every section is a frozen dataclass; the schema *is* the dataclasses below, and :class:`Config` holds one of
each. Unknown keys, wrong types and impossible values raise :class:`ConfigError` naming the dotted key (the
unknown keys and types while :mod:`rsi_jax.config_loader` builds the dataclasses, the values in each
section's ``validate``).
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Mapping
from pathlib import Path


class ConfigError(ValueError):
  """A configuration value is unknown, of the wrong type, or impossible. The message names the key."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
  name: str = "rsi"
  output_dir: str = "runs"
  seed: int = 0
  log_level: str = "info"  # level of the run's log file (<run folder>/train.log); the console shows step lines
  progress: bool = True  # tqdm progress bars for long work
  # auto: rerunning the same command resumes the run folder's latest complete checkpoint (MaxText's rule);
  # never: a run folder that already holds a run is an error
  resume: str = "auto"
  # resuming with settings that differ from the run folder's config.yml (anything but the console, resume and
  # the folder's location) is refused unless this is set; the change is then recorded in lineage.json
  allow_config_change: bool = False
  # SIGTERM / Ctrl-C: the run aborts what runs, checkpoints and exits; should that take longer than this (a hung
  # Docker call, a long update), the process ends at this many seconds after the notice regardless (its
  # containers removed; the rerun resumes the newest complete checkpoint, which a write in progress never
  # replaces). A preemption notice gives ~30 s. 0 = no limit
  preempt_budget_s: float = 25.0
  # which rollout episodes keep their transcript (phases/<phase>/episodes/, read by `python -m rsi_jax.view`):
  # all | failures (unsuccessful or infrastructure-failed episodes only) | sample:N (N episodes per step,
  # chosen from the step's seed)
  keep_transcripts: str = "all"

  def validate(self, p):
    _check(self.name != "", f"{p}.name", "must not be empty")
    _check("/" not in self.name, f"{p}.name", f"must not contain '/', got {self.name!r}")
    _check(self.output_dir != "", f"{p}.output_dir", "must not be empty")
    _check(self.preempt_budget_s >= 0, f"{p}.preempt_budget_s", f"must be >= 0 (0 = no limit), got "
           f"{self.preempt_budget_s}")
    check_location(self.output_dir, f"{p}.output_dir")
    _check(self.resume in ("auto", "never"), f"{p}.resume", f"must be 'auto' or 'never', got {self.resume!r}")
    _check(self.log_level in ("debug", "info", "warning", "error"), f"{p}.log_level",
           f"must be one of debug/info/warning/error, got {self.log_level!r}")
    _check(_transcript_sample_size(self.keep_transcripts) is not None, f"{p}.keep_transcripts",
           f"must be 'all', 'failures' or 'sample:N' with N >= 1, got {self.keep_transcripts!r}")


def _transcript_sample_size(mode: str) -> int | None:
  """``run.keep_transcripts`` parsed: 0 for all / failures, N for sample:N, None for anything else."""
  if mode in ("all", "failures"):
    return 0
  m = re.fullmatch(r"sample:([0-9]+)", mode)
  if m is None or int(m.group(1)) < 1:
    return None
  return int(m.group(1))


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
      _check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    _check(self.base_num_query_heads % self.base_num_kv_heads == 0, f"{p}.base_num_kv_heads",
           f"must divide base_num_query_heads ({self.base_num_query_heads}), got {self.base_num_kv_heads}")
    for k in ("dtype", "weight_dtype"):
      _check(getattr(self, k) in ("float32", "bfloat16", "float16"), f"{p}.{k}",
             f"must be float32/bfloat16/float16, got {getattr(self, k)!r}")
    _check(self.normalization_layer_epsilon > 0, f"{p}.normalization_layer_epsilon", "must be > 0")
    _check(self.logits_dtype in ("float32", "bfloat16"), f"{p}.logits_dtype",
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
    _check(len(autos) <= 1, f"{p}.{autos[-1] if autos else ''}", "at most one mesh axis may be -1")
    for k, v in self.items():
      _check(v == -1 or v >= 1, f"{p}.{k}", f"must be >= 1 or -1, got {v}")

  def items(self):
    return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]

  def batch_shards(self) -> int | None:
    """Number of shards the batch axis is split over (data x fsdp, ICI x DCN), None if an axis is auto."""
    v = [self.ici_data_parallelism, self.ici_fsdp_parallelism, self.dcn_data_parallelism,
         self.dcn_fsdp_parallelism]
    return None if -1 in v else math.prod(v)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW + global-norm clipping (paper App. A). Constant learning rate within a phase."""
  learning_rate: float = 5e-7
  b1: float = 0.90
  b2: float = 0.98
  eps: float = 1e-8
  weight_decay: float = 0.10
  grad_clip: float = 1.0
  # false (Megatron's default, the paper's stack): norm scales and biases are not decayed
  decay_norms_and_biases: bool = False

  def validate(self, p):
    _check(self.learning_rate >= 0, f"{p}.learning_rate", f"must be >= 0, got {self.learning_rate}")
    _check(0 <= self.b1 < 1, f"{p}.b1", f"must be in [0, 1), got {self.b1}")
    _check(0 <= self.b2 < 1, f"{p}.b2", f"must be in [0, 1), got {self.b2}")
    _check(self.eps > 0, f"{p}.eps", f"must be > 0, got {self.eps}")
    _check(self.weight_decay >= 0, f"{p}.weight_decay", f"must be >= 0, got {self.weight_decay}")
    _check(self.grad_clip > 0, f"{p}.grad_clip", f"must be > 0, got {self.grad_clip}")


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
  # TB-GAE's recurrence (rsi_jax/rl/advantages.py): scan (sequential lax.scan), associative
  # (lax.associative_scan, log depth) or auto (associative on accelerators, scan on CPU); same results
  gae_impl: str = "auto"

  def validate(self, p):
    _check(self.gae_impl in ("scan", "associative", "auto"), f"{p}.gae_impl",
           f"must be 'scan', 'associative' or 'auto', got {self.gae_impl!r}")
    for k in ("minibatches", "ppo_epochs"):
      _check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    for k in ("gamma_turn", "lambda_turn"):
      _check(0 <= getattr(self, k) <= 1, f"{p}.{k}", f"must be in [0, 1], got {getattr(self, k)}")
    for k in ("clip_low", "clip_high", "value_clip"):
      _check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    _check(self.clip_low < 1, f"{p}.clip_low", f"must be < 1 (ratio floor 1-clip_low > 0), got {self.clip_low}")
    for k in ("logprob_chunk", "pad_multiple"):
      _check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    _check(self.per_device_token_budget >= 0, f"{p}.per_device_token_budget",
           f"must be >= 0 (0 = no packing), got {self.per_device_token_budget}")
    _check(self.per_device_token_budget % self.pad_multiple == 0, f"{p}.per_device_token_budget",
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
    _check(self.global_batch > 0, f"{p}.global_batch", f"must be > 0, got {self.global_batch}")
    _check(self.requested >= self.global_batch, f"{p}.requested",
           f"must be >= global_batch ({self.global_batch}), got {self.requested}")
    _check(self.temperature >= 0, f"{p}.temperature", f"must be >= 0, got {self.temperature}")
    _check(0 < self.top_p <= 1, f"{p}.top_p", f"must be in (0, 1], got {self.top_p}")
    _check(self.top_k >= 0, f"{p}.top_k", f"must be >= 0, got {self.top_k}")
    _check(self.max_new_tokens > 0, f"{p}.max_new_tokens", "must be > 0")
    _check(self.max_input_tokens > 0, f"{p}.max_input_tokens", "must be > 0")
    _check(self.responses_per_task > 0, f"{p}.responses_per_task", f"must be > 0, got {self.responses_per_task}")
    _check(self.max_staleness >= 0, f"{p}.max_staleness", f"must be >= 0, got {self.max_staleness}")
    _check(not (self.deterministic and self.max_staleness > 0), f"{p}.deterministic",
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
    _check(self.kind in ("fdr", "spr"), f"{p}.kind", f"must be 'fdr' or 'spr', got {self.kind!r}")
    _check(self.fallback_divisor > 0, f"{p}.fallback_divisor", f"must be > 0, got {self.fallback_divisor}")
    _check(0 < self.calibration_quantile <= 1, f"{p}.calibration_quantile", "must be in (0, 1]")
    for pat in self.hygiene_patterns:
      try:
        re.compile(pat)
      except (re.error, TypeError) as e:
        raise ConfigError(f"{p}.hygiene_patterns: {pat!r} is not a valid regex: {e}") from None
    _check(self.high_reward_failure_threshold >= 0, f"{p}.high_reward_failure_threshold",
           f"must be >= 0, got {self.high_reward_failure_threshold}")
    _check(0 <= self.high_reward_failure_share <= 1, f"{p}.high_reward_failure_share",
           f"must be in [0, 1], got {self.high_reward_failure_share}")
    _check(self.long_low_reward_turns >= 0, f"{p}.long_low_reward_turns",
           f"must be >= 0, got {self.long_low_reward_turns}")
    _check(self.long_low_reward_mean >= 0, f"{p}.long_low_reward_mean",
           f"must be >= 0, got {self.long_low_reward_mean}")
    for k in ("suppression_factor", "long_low_reward_factor"):
      _check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    _check(self.recalibration_min_samples >= 1, f"{p}.recalibration_min_samples",
           f"must be >= 1, got {self.recalibration_min_samples}")


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  num_slots: int = 8  # concurrent decode slots (continuous batching)
  # longest prompt served whole: the shipped tasks' first prompts are 266-444 tokens and grow every turn
  max_prefill_length: int = 8192
  prefill_buckets: tuple = (512, 1024, 2048, 4096, 8192)
  # positions per sequence, prompt included (paged: a block table's span; slot: allocated per slot; maxtext:
  # max_prefill_length prompt entries + the rest for generated tokens)
  max_cache_length: int = 104_192
  swap_policy: str = "finish_on_old"  # finish_on_old | mark
  prompt_overflow: str = "reject"  # prompt > max_prefill_length: reject (finish "prompt_too_long") | error | truncate_left
  num_devices: int = 1  # devices of the sampling mesh (all on MaxText's tensor axis)
  # paged: a pool of KV blocks with per-sequence block tables, chunked prefill, prefix reuse
  # (rsi_jax/sampler/paged.py); slot: a per-slot KV cache of max_cache_length positions, whole-prompt MaxText
  # prefill; maxtext: MaxText's own autoregressive mode (reference, slowest)
  decode_impl: str = "paged"
  decode_steps: int = 4  # decode steps per dispatch (one host round trip per this many tokens per slot)
  attention_block: int = 512  # slot decode: cache positions per attention block (reads stop at the last used)
  block_size: int = 64  # paged: positions per KV block
  kv_blocks: int = 2048  # paged: blocks in the pool; 0 = num_slots x max_cache_length worth (the slot cache's)
  prefill_chunk: int = 512  # paged: prompt tokens per prefill call (interleaved with decode steps)
  prefix_cache: bool = True  # paged: reuse the keys of a cached prompt prefix (e.g. the episode's previous turn)

  def validate(self, p):
    _check(self.decode_impl in ("paged", "slot", "maxtext"), f"{p}.decode_impl",
           f"must be 'paged', 'slot' or 'maxtext', got {self.decode_impl!r}")
    _check(self.block_size >= 1, f"{p}.block_size", f"must be >= 1, got {self.block_size}")
    _check(self.prefill_chunk >= 1, f"{p}.prefill_chunk", f"must be >= 1, got {self.prefill_chunk}")
    per_seq = -(-self.max_cache_length // self.block_size)
    _check(self.kv_blocks == 0 or self.kv_blocks >= per_seq, f"{p}.kv_blocks",
           f"must be 0 (auto) or >= {per_seq} (one sequence of max_cache_length={self.max_cache_length} "
           f"positions), got {self.kv_blocks}")
    _check(self.decode_steps >= 1, f"{p}.decode_steps", f"must be >= 1, got {self.decode_steps}")
    _check(self.attention_block >= 1, f"{p}.attention_block", f"must be >= 1, got {self.attention_block}")
    _check(self.num_slots > 0, f"{p}.num_slots", f"must be > 0, got {self.num_slots}")
    _check(self.max_prefill_length > 0, f"{p}.max_prefill_length", f"must be > 0, got {self.max_prefill_length}")
    _check(self.prompt_overflow in ("reject", "error", "truncate_left"), f"{p}.prompt_overflow",
           f"must be 'reject', 'error' or 'truncate_left', got {self.prompt_overflow!r}")
    _check(self.num_devices > 0, f"{p}.num_devices", f"must be > 0, got {self.num_devices}")
    _check(self.max_cache_length > self.max_prefill_length, f"{p}.max_cache_length",
           f"must be > max_prefill_length ({self.max_prefill_length}): generated tokens need room")
    _check(all(b > 0 for b in self.prefill_buckets), f"{p}.prefill_buckets", "must be positive")
    _check(list(self.prefill_buckets) == sorted(self.prefill_buckets), f"{p}.prefill_buckets",
           "must be increasing")
    _check(all(b <= self.max_prefill_length for b in self.prefill_buckets), f"{p}.prefill_buckets",
           f"must not exceed max_prefill_length ({self.max_prefill_length})")
    _check(self.swap_policy in ("finish_on_old", "mark"), f"{p}.swap_policy",
           f"must be 'finish_on_old' or 'mark', got {self.swap_policy!r}")


@dataclasses.dataclass(frozen=True)
class EnvConfig:
  tasks_dir: str = "tasks"
  max_tasks: int = 0  # the task pool: 0 = every task in tasks_dir, else this many, round-robin over families
  # false: a task folder that cannot be used is refused and listed with its reason, the others train; true: the
  # first such folder stops the run
  strict_tasks: bool = False
  base_image: str = "rsi-base"
  # upstream base image (glob, first match wins) -> local image, for images not available locally; merged over
  # rsi_jax.env.tasks.DEFAULT_IMAGE_MAP (ubuntu, debian, python, buildpack-deps, TB base images -> the family)
  image_map: dict = dataclasses.field(default_factory=dict)
  docker_hosts: tuple = ()  # () = the local daemon (DOCKER_HOST or the default socket)
  # while every endpoint is down, an episode waits this long for one to answer again, then fails with
  # rsi_jax.env.pool.AllEndpointsDown (a dead endpoint's episodes are run again on a live one)
  endpoint_wait_s: float = 120.0
  concurrency: int = 4
  network: str = "none"
  command_timeout_s: float = 60.0
  agent_timeout_s: float = 900.0
  verifier_timeout_s: float = 300.0
  output_cap_bytes: int = 10_000
  max_turns: int = 32
  summarize_threshold_tokens: int = 32_000
  harness: str = "json"
  build_network: str = "host"  # network of task image builds: none | host | default (pip/apt/uv at build time)
  # CA bundle those builds trust: "" = the host's (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, PIP_CERT, CURL_CA_BUNDLE),
  # a PEM file, or "none"; needed behind TLS-inspecting proxies
  build_ca_bundle: str = ""
  pids_limit: int = 512  # per container, unless the task sets environment.pids
  disk_limit: str = "10G"  # what one container may write, unless the task sets environment.storage

  def validate(self, p):
    _check(self.concurrency > 0, f"{p}.concurrency", f"must be > 0, got {self.concurrency}")
    _check(self.endpoint_wait_s >= 0, f"{p}.endpoint_wait_s", f"must be >= 0, got {self.endpoint_wait_s}")
    _check(self.max_tasks >= 0, f"{p}.max_tasks", f"must be >= 0 (0 = all), got {self.max_tasks}")
    _check(isinstance(self.strict_tasks, bool), f"{p}.strict_tasks",
           f"must be true or false, got {self.strict_tasks!r}")
    _check(self.network in ("none", "host", "bridge"), f"{p}.network",
           f"must be none/host/bridge, got {self.network!r}")
    _check(self.build_network in ("none", "host", "default"), f"{p}.build_network",
           f"must be none/host/default, got {self.build_network!r}")
    _check(self.harness in ("json", "xml", "oracle"), f"{p}.harness",
           f"must be json/xml/oracle, got {self.harness!r}")
    _check(self.pids_limit > 0, f"{p}.pids_limit", f"must be > 0, got {self.pids_limit}")
    _check(self.build_ca_bundle in ("", "none") or Path(self.build_ca_bundle).is_file(), f"{p}.build_ca_bundle",
           f"must be '', 'none' or an existing PEM file, got {self.build_ca_bundle!r}")
    try:
      from rsi_jax.units import parse_memory
      parse_memory(self.disk_limit)
    except ValueError:
      _check(False, f"{p}.disk_limit", f"must be a size such as \"10G\", got {self.disk_limit!r}")
    for k, v in self.image_map.items():
      _check(isinstance(v, str) and v != "", f"{p}.image_map.{k}", f"must map to an image name, got {v!r}")
    for k in ("command_timeout_s", "agent_timeout_s", "verifier_timeout_s"):
      _check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    for k in ("output_cap_bytes", "max_turns", "summarize_threshold_tokens"):
      _check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")


@dataclasses.dataclass(frozen=True)
class RSRConfig:
  """The RSR funnel (paper §2.1, App. D; :mod:`rsi_jax.rsr`)."""
  harnesses: tuple = ("json", "xml")  # H: the harnesses discovery runs every task under
  discovery_attempts: int = 1  # discovery episodes per task and harness
  # K: runbooks planned per verified discovery; 0 = the runbook stage off (verified self-imitation: the
  # discovery episodes that verify and pass the leakage screen are Q_clean themselves; labelled as such)
  num_runbooks: int = 4
  num_repeats: int = 4  # M: fresh executions per accepted runbook
  families: tuple = ()  # task families (category) of the pool the funnel runs on; () = every task
  max_tasks: int = 0  # of those, 0 = all, else this many (the first of each family, round-robin over families)
  target_harness: str = "json"  # H0: fresh execution and the stored SFT trajectories
  policy: str = "actor"  # actor | scripted (a test double that knows the reference solutions: smoke runs, tests)
  judge: bool = False  # also ask the actor to review runbooks the rules accept (it can only reject)
  plan_template: str = "configs/rsr/plan.md"  # I_plan
  exec_template: str = "configs/rsr/exec.md"  # I_exec
  judge_template: str = "configs/rsr/judge.md"
  runbook_max_tokens: int = 1024  # the planner's completion limit
  transcript_output_chars: int = 2000  # C(τ): each command's output cut to this many characters

  def validate(self, p):
    known = ("json", "xml")
    _check(len(self.harnesses) > 0 and all(h in known for h in self.harnesses)
           and len(set(self.harnesses)) == len(self.harnesses), f"{p}.harnesses",
           f"must list distinct harnesses of {list(known)}, got {list(self.harnesses)}")
    for k in ("discovery_attempts", "num_repeats", "runbook_max_tokens", "transcript_output_chars"):
      _check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    _check(self.num_runbooks >= 0, f"{p}.num_runbooks", f"must be >= 0 (0: runbook stage off), got {self.num_runbooks}")
    _check(self.max_tasks >= 0, f"{p}.max_tasks", f"must be >= 0 (0: every task), got {self.max_tasks}")
    _check(all(isinstance(f, str) and f for f in self.families), f"{p}.families",
           f"must list task families (names), got {list(self.families)}")
    _check(self.target_harness in known, f"{p}.target_harness", f"must be json/xml, got {self.target_harness!r}")
    _check(self.policy in ("actor", "scripted"), f"{p}.policy", f"must be actor/scripted, got {self.policy!r}")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Evaluation (``python -m rsi_jax.eval`` and the training program's in-training evaluation)."""
  tasks_dir: str = ""  # the evaluation suite; "" = none during training, env.tasks_dir for python -m rsi_jax.eval
  max_tasks: int = 0  # 0 = every task of the suite, else this many (round-robin over families)
  repeats: int = 3  # R of Mean@R / pass@R
  harness: str = "json"  # json | xml (the actor) | oracle (reference solutions)
  infra_retries: int = 2  # an attempt that failed for infrastructure reasons is run again up to this often
  temperature: float = 0.6  # the paper's evaluation protocol
  top_p: float = 0.95
  max_new_tokens: int = 8192

  def validate(self, p):
    _check(self.repeats > 0, f"{p}.repeats", f"must be > 0, got {self.repeats}")
    _check(self.max_tasks >= 0, f"{p}.max_tasks", f"must be >= 0 (0 = all), got {self.max_tasks}")
    _check(self.infra_retries >= 0, f"{p}.infra_retries", f"must be >= 0, got {self.infra_retries}")
    _check(self.harness in ("json", "xml", "oracle"), f"{p}.harness", f"must be json/xml/oracle, got {self.harness!r}")
    _check(self.temperature >= 0, f"{p}.temperature", f"must be >= 0, got {self.temperature}")
    _check(0 < self.top_p <= 1, f"{p}.top_p", f"must be in (0, 1], got {self.top_p}")
    _check(self.max_new_tokens > 0, f"{p}.max_new_tokens", f"must be > 0, got {self.max_new_tokens}")


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  """The phase plan. A phase's kind comes from its name: ``rsrN`` (Recursive Self-Rewrite, actor-only SFT),
  ``critic_seed`` (critic-only updates, actor frozen), ``rprN`` (Recursive Policy-Refine, PPO)."""
  phases: tuple = ("rsr1", "critic_seed", "rpr1", "rsr2", "rpr2")
  rollout_steps: int = 36  # per RPR phase
  critic_only_steps: int = 4  # at the start of each RPR phase (actor frozen)
  critic_seed_epochs: int = 1  # critic seed: passes over the task pool (rollout steps = epochs x pool / batch)
  checkpoint_every: int = 5  # phase steps between checkpoints (a phase's last step is always saved)
  keep_checkpoints: int = 3  # per phase, the newest kept (the phase's final one is always the newest)
  eval_every: int = 10  # phase steps between in-training evaluations on eval.tasks_dir (and at each phase's end)
  checkpoint_dir: str = ""  # "" = <run.output_dir>/<run.name>/checkpoints; may be an object-store URL
  sft_epochs: int = 1  # RSR: passes over the verified trajectories, rollout.global_batch per update
  # most samples per device in one learner pass (packed into its row, or one row each without packing);
  # an update accumulates its passes' gradients in float32. 0 = no limit (with packing, only the token
  # budget splits passes; without, one pass per update)
  micro_batch: int = 0
  # Where a phase's weights come from, by phase name: "previous" (the default: the previous phase's output;
  # the first phase's actor starts from model.hf_path or a fresh init), "init" (actor: model.hf_path or a
  # fresh init; critic: the phase's starting actor backbone + a fresh value head, the critic seed's default)
  # or a checkpoint folder (an Orbax step folder, or a phase folder whose newest step is taken).
  actor_from: dict = dataclasses.field(default_factory=dict)
  critic_from: dict = dataclasses.field(default_factory=dict)
  # Per-phase config overrides from a run file or the command line ({phase: {section: {key: value}}}), over the
  # run file and configs/phases/<phase>.yml; plain command-line key=value overrides win over both.
  phase_overrides: dict = dataclasses.field(default_factory=dict)

  def validate(self, p):
    _check(len(self.phases) > 0, f"{p}.phases", "must name at least one phase")
    check_location(self.checkpoint_dir, f"{p}.checkpoint_dir")
    for ph in self.phases:
      _check(phase_kind(ph) is not None, f"{p}.phases",
             f"unknown phase {ph!r} (known: rsr<N>, critic_seed, rpr<N>)")
    _check(len(set(self.phases)) == len(self.phases), f"{p}.phases", f"a phase is listed twice: {list(self.phases)}")
    for k in ("actor_from", "critic_from"):
      for ph, v in getattr(self, k).items():
        _check(ph in self.phases, f"{p}.{k}.{ph}", f"not a phase of the plan {list(self.phases)}")
        _check(isinstance(v, str) and v != "", f"{p}.{k}.{ph}",
               f"must be 'previous', 'init' or a checkpoint path, got {v!r}")
    for ph, v in self.phase_overrides.items():  # a run file's per-phase values: a narrower plan may leave some out
      _check(phase_kind(ph) is not None, f"{p}.phase_overrides.{ph}",
             f"unknown phase {ph!r} (known: rsr<N>, critic_seed, rpr<N>)")
      _check(isinstance(v, Mapping), f"{p}.phase_overrides.{ph}", f"must be a mapping of config sections, got {v!r}")
    _check(self.rollout_steps > 0, f"{p}.rollout_steps", "must be > 0")
    _check(0 <= self.critic_only_steps <= self.rollout_steps, f"{p}.critic_only_steps",
           f"must be in [0, rollout_steps={self.rollout_steps}], got {self.critic_only_steps}")
    for k in ("critic_seed_epochs", "checkpoint_every", "keep_checkpoints", "eval_every", "sft_epochs"):
      _check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    _check(self.micro_batch >= 0, f"{p}.micro_batch", f"must be >= 0, got {self.micro_batch}")


PHASE_KINDS = {"rsr": r"rsr\d+", "critic_seed": r"critic_seed", "rpr": r"rpr\d+"}


def phase_kind(name: str) -> str | None:
  """``rsr`` | ``critic_seed`` | ``rpr`` for a phase name (``rsr1``, ``critic_seed``, ``rpr2``), else None."""
  for kind, pat in PHASE_KINDS.items():
    if re.fullmatch(pat, str(name)):
      return kind
  return None


@dataclasses.dataclass(frozen=True)
class Config:
  run: RunConfig = dataclasses.field(default_factory=RunConfig)
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  actor_optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
  critic_optim: OptimConfig = dataclasses.field(
      default_factory=lambda: OptimConfig(learning_rate=1.5e-5, grad_clip=100.0))
  rl: RLConfig = dataclasses.field(default_factory=RLConfig)
  rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
  reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
  sampler: SamplerConfig = dataclasses.field(default_factory=SamplerConfig)
  env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
  rsr: RSRConfig = dataclasses.field(default_factory=RSRConfig)
  eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
  pipeline: PipelineConfig = dataclasses.field(default_factory=PipelineConfig)
  # The dotted keys the user set (not a config key): a loaded run file chain without configs/base.yml, the
  # command line, and the overrides applied since (see user_keys).
  _user_keys: typing.ClassVar[frozenset] = frozenset()

  def user_keys(self) -> frozenset:
    """The dotted keys (``actor_optim.learning_rate``, ``env.image_map``) the user's files and command line
    set: what :func:`rsi_jax.config_loader.load_phase_overlay` leaves to them. Keys set by ``configs/base.yml``
    are not among them."""
    return self._user_keys

  def validate(self, p=""):
    for f in dataclasses.fields(self):
      getattr(self, f.name).validate(f.name)
    shards = self.mesh.batch_shards()
    if shards is not None:
      _check(self.rollout.global_batch % shards == 0, "rollout.global_batch",
             f"must be divisible by the mesh's batch shards (data x fsdp = {shards}), "
             f"got {self.rollout.global_batch}")

  def to_dict(self) -> dict:
    return _to_plain(self)


_STORES = ("gs", "s3", "gcs", "hdfs", "az", "abfs", "file")  # object-store schemes a location may use


def check_location(value: str, key: str):
  """A folder or an object-store URL; a URL with a typo in its scheme (``gs:/b``, ``gs//b``, ``gs:b``) is an
  error rather than a local folder named ``gs:`` or ``gs`` in the current directory."""
  m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)(:/*|//)", value)
  if m and m.group(1).lower() in _STORES and not value.startswith(f"{m.group(1)}://"):
    raise ConfigError(f"{key}: {value!r} looks like a {m.group(1)}:// URL with a typo (write "
                      f"{m.group(1)}://bucket/path)")


def _check(ok: bool, key: str, msg: str):
  if not ok:
    raise ConfigError(f"{key}: {msg}")


def _to_plain(obj):
  if dataclasses.is_dataclass(obj):
    return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
  if isinstance(obj, Mapping):
    return {k: _to_plain(v) for k, v in obj.items()}
  if isinstance(obj, tuple):
    return [_to_plain(v) for v in obj]
  return obj
