"""The configuration schema: the whole :class:`Config` and its run, sampler, env, RSR, eval and pipeline sections.

Every section is a frozen dataclass; the schema *is* these dataclasses and the learner's sections in
:mod:`rsi_jax.config_learning` (model, mesh, optimizers, RL, rollout, reward), and :class:`Config` holds one of
each. Unknown keys, wrong types and impossible values raise :class:`~rsi_jax.config_checks.ConfigError` naming
the dotted key (the unknown keys and types while :mod:`rsi_jax.config_loader` builds the dataclasses, the values
in each section's ``validate``, with the checks of :mod:`rsi_jax.config_checks`).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Mapping
from pathlib import Path

from rsi_jax.config_checks import check, check_location
from rsi_jax.config_learning import MeshConfig, ModelConfig, OptimConfig, RLConfig, RewardConfig, RolloutConfig


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
    check(self.name != "", f"{p}.name", "must not be empty")
    check("/" not in self.name, f"{p}.name", f"must not contain '/', got {self.name!r}")
    check(self.output_dir != "", f"{p}.output_dir", "must not be empty")
    check(self.preempt_budget_s >= 0, f"{p}.preempt_budget_s", f"must be >= 0 (0 = no limit), got "
           f"{self.preempt_budget_s}")
    check_location(self.output_dir, f"{p}.output_dir")
    check(self.resume in ("auto", "never"), f"{p}.resume", f"must be 'auto' or 'never', got {self.resume!r}")
    check(self.log_level in ("debug", "info", "warning", "error"), f"{p}.log_level",
           f"must be one of debug/info/warning/error, got {self.log_level!r}")
    check(_transcript_sample_size(self.keep_transcripts) is not None, f"{p}.keep_transcripts",
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
    check(self.decode_impl in ("paged", "slot", "maxtext"), f"{p}.decode_impl",
           f"must be 'paged', 'slot' or 'maxtext', got {self.decode_impl!r}")
    check(self.block_size >= 1, f"{p}.block_size", f"must be >= 1, got {self.block_size}")
    check(self.prefill_chunk >= 1, f"{p}.prefill_chunk", f"must be >= 1, got {self.prefill_chunk}")
    per_seq = -(-self.max_cache_length // self.block_size)
    check(self.kv_blocks == 0 or self.kv_blocks >= per_seq, f"{p}.kv_blocks",
           f"must be 0 (auto) or >= {per_seq} (one sequence of max_cache_length={self.max_cache_length} "
           f"positions), got {self.kv_blocks}")
    check(self.decode_steps >= 1, f"{p}.decode_steps", f"must be >= 1, got {self.decode_steps}")
    check(self.attention_block >= 1, f"{p}.attention_block", f"must be >= 1, got {self.attention_block}")
    check(self.num_slots > 0, f"{p}.num_slots", f"must be > 0, got {self.num_slots}")
    check(self.max_prefill_length > 0, f"{p}.max_prefill_length", f"must be > 0, got {self.max_prefill_length}")
    check(self.prompt_overflow in ("reject", "error", "truncate_left"), f"{p}.prompt_overflow",
           f"must be 'reject', 'error' or 'truncate_left', got {self.prompt_overflow!r}")
    check(self.num_devices > 0, f"{p}.num_devices", f"must be > 0, got {self.num_devices}")
    check(self.max_cache_length > self.max_prefill_length, f"{p}.max_cache_length",
           f"must be > max_prefill_length ({self.max_prefill_length}): generated tokens need room")
    check(all(b > 0 for b in self.prefill_buckets), f"{p}.prefill_buckets", "must be positive")
    check(list(self.prefill_buckets) == sorted(self.prefill_buckets), f"{p}.prefill_buckets",
           "must be increasing")
    check(all(b <= self.max_prefill_length for b in self.prefill_buckets), f"{p}.prefill_buckets",
           f"must not exceed max_prefill_length ({self.max_prefill_length})")
    check(self.swap_policy in ("finish_on_old", "mark"), f"{p}.swap_policy",
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
    check(self.concurrency > 0, f"{p}.concurrency", f"must be > 0, got {self.concurrency}")
    check(self.endpoint_wait_s >= 0, f"{p}.endpoint_wait_s", f"must be >= 0, got {self.endpoint_wait_s}")
    check(self.max_tasks >= 0, f"{p}.max_tasks", f"must be >= 0 (0 = all), got {self.max_tasks}")
    check(isinstance(self.strict_tasks, bool), f"{p}.strict_tasks",
           f"must be true or false, got {self.strict_tasks!r}")
    check(self.network in ("none", "host", "bridge"), f"{p}.network",
           f"must be none/host/bridge, got {self.network!r}")
    check(self.build_network in ("none", "host", "default"), f"{p}.build_network",
           f"must be none/host/default, got {self.build_network!r}")
    check(self.harness in ("json", "xml", "oracle"), f"{p}.harness",
           f"must be json/xml/oracle, got {self.harness!r}")
    check(self.pids_limit > 0, f"{p}.pids_limit", f"must be > 0, got {self.pids_limit}")
    check(self.build_ca_bundle in ("", "none") or Path(self.build_ca_bundle).is_file(), f"{p}.build_ca_bundle",
           f"must be '', 'none' or an existing PEM file, got {self.build_ca_bundle!r}")
    try:
      from rsi_jax.units import parse_memory
      parse_memory(self.disk_limit)
    except ValueError:
      check(False, f"{p}.disk_limit", f"must be a size such as \"10G\", got {self.disk_limit!r}")
    for k, v in self.image_map.items():
      check(isinstance(v, str) and v != "", f"{p}.image_map.{k}", f"must map to an image name, got {v!r}")
    for k in ("command_timeout_s", "agent_timeout_s", "verifier_timeout_s"):
      check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    for k in ("output_cap_bytes", "max_turns", "summarize_threshold_tokens"):
      check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")


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
  # | corpus: no funnel, no tasks: SFT on corpus_pairs generated pairs of the stand-in pre-training corpus
  # (rsi_jax.env.base_corpus: instruction -> one command, rendered as the target harness's first turn), what a
  # from-scratch tiny model learns first so that it copies an instruction's values like a pre-trained base
  corpus_pairs: int = 0  # only with policy corpus (and > 0 there)
  # policy corpus: this many two-step procedure episodes too (read a value, act on it, done: base_corpus.PROCEDURES),
  # recorded by the target harness's own loop; they need env.max_turns >= 3
  corpus_procedures: int = 0
  # policy corpus: this many runbook tasks too (base_corpus.runbook_tasks: shapes, and procedures when
  # corpus_procedures > 0), each two samples: the planning call (plan_template over the instruction and the
  # commands' transcript -> a runbook of those commands) and its execution under exec_template's private guidance
  corpus_runbooks: int = 0
  judge: bool = False  # also ask the actor to review runbooks the rules accept (it can only reject)
  # the accepted runbooks are SFT samples too (planning prompt -> runbook), and so is each accepted execution as it
  # ran, under its private guidance (besides its projection): a warm start's demonstrations of writing and of
  # following a runbook, standing in for what a pre-trained base knows; only with policy scripted (the actor's
  # own runbooks and guided runs are never its training data: RSR trains on the projected executions, §2.1)
  plan_demonstrations: bool = False
  plan_template: str = "configs/rsr/plan.md"  # I_plan
  exec_template: str = "configs/rsr/exec.md"  # I_exec
  judge_template: str = "configs/rsr/judge.md"
  runbook_max_tokens: int = 1024  # the planner's completion limit
  transcript_output_chars: int = 2000  # C(τ): each command's output cut to this many characters

  def validate(self, p):
    known = ("json", "xml")
    check(len(self.harnesses) > 0 and all(h in known for h in self.harnesses)
           and len(set(self.harnesses)) == len(self.harnesses), f"{p}.harnesses",
           f"must list distinct harnesses of {list(known)}, got {list(self.harnesses)}")
    for k in ("discovery_attempts", "num_repeats", "runbook_max_tokens", "transcript_output_chars"):
      check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    check(self.num_runbooks >= 0, f"{p}.num_runbooks", f"must be >= 0 (0: runbook stage off), got {self.num_runbooks}")
    check(self.max_tasks >= 0, f"{p}.max_tasks", f"must be >= 0 (0: every task), got {self.max_tasks}")
    check(all(isinstance(f, str) and f for f in self.families), f"{p}.families",
           f"must list task families (names), got {list(self.families)}")
    check(self.target_harness in known, f"{p}.target_harness", f"must be json/xml, got {self.target_harness!r}")
    check(self.policy in ("actor", "scripted", "corpus"), f"{p}.policy",
          f"must be actor/scripted/corpus, got {self.policy!r}")
    check((self.corpus_pairs > 0) == (self.policy == "corpus"), f"{p}.corpus_pairs",
          f"must be > 0 with policy corpus and 0 otherwise (the corpus is only used by it), got "
          f"{self.corpus_pairs} with policy {self.policy!r}")
    check(self.corpus_procedures >= 0 and (self.corpus_procedures == 0 or self.policy == "corpus"),
          f"{p}.corpus_procedures", f"must be >= 0, and 0 unless policy is corpus, got {self.corpus_procedures} "
          f"with policy {self.policy!r}")
    check(self.corpus_runbooks >= 0 and (self.corpus_runbooks == 0 or self.policy == "corpus"),
          f"{p}.corpus_runbooks", f"must be >= 0, and 0 unless policy is corpus, got {self.corpus_runbooks} "
          f"with policy {self.policy!r}")
    check(not self.plan_demonstrations or (self.policy == "scripted" and self.num_runbooks > 0),
          f"{p}.plan_demonstrations", "needs policy scripted and num_runbooks > 0 (demonstrations of the runbook "
          f"format come from the scripted planner), got policy {self.policy!r}, num_runbooks {self.num_runbooks}")


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
    check(self.repeats > 0, f"{p}.repeats", f"must be > 0, got {self.repeats}")
    check(self.max_tasks >= 0, f"{p}.max_tasks", f"must be >= 0 (0 = all), got {self.max_tasks}")
    check(self.infra_retries >= 0, f"{p}.infra_retries", f"must be >= 0, got {self.infra_retries}")
    check(self.harness in ("json", "xml", "oracle"), f"{p}.harness", f"must be json/xml/oracle, got {self.harness!r}")
    check(self.temperature >= 0, f"{p}.temperature", f"must be >= 0, got {self.temperature}")
    check(0 < self.top_p <= 1, f"{p}.top_p", f"must be in (0, 1], got {self.top_p}")
    check(self.max_new_tokens > 0, f"{p}.max_new_tokens", f"must be > 0, got {self.max_new_tokens}")


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
    check(len(self.phases) > 0, f"{p}.phases", "must name at least one phase")
    check_location(self.checkpoint_dir, f"{p}.checkpoint_dir")
    for ph in self.phases:
      check(phase_kind(ph) is not None, f"{p}.phases",
             f"unknown phase {ph!r} (known: rsr<N>, critic_seed, rpr<N>)")
    check(len(set(self.phases)) == len(self.phases), f"{p}.phases", f"a phase is listed twice: {list(self.phases)}")
    for k in ("actor_from", "critic_from"):
      for ph, v in getattr(self, k).items():
        check(ph in self.phases, f"{p}.{k}.{ph}", f"not a phase of the plan {list(self.phases)}")
        check(isinstance(v, str) and v != "", f"{p}.{k}.{ph}",
               f"must be 'previous', 'init' or a checkpoint path, got {v!r}")
    for ph, v in self.phase_overrides.items():  # a run file's per-phase values: a narrower plan may leave some out
      check(phase_kind(ph) is not None, f"{p}.phase_overrides.{ph}",
             f"unknown phase {ph!r} (known: rsr<N>, critic_seed, rpr<N>)")
      check(isinstance(v, Mapping), f"{p}.phase_overrides.{ph}", f"must be a mapping of config sections, got {v!r}")
    check(self.rollout_steps > 0, f"{p}.rollout_steps", "must be > 0")
    check(0 <= self.critic_only_steps <= self.rollout_steps, f"{p}.critic_only_steps",
           f"must be in [0, rollout_steps={self.rollout_steps}], got {self.critic_only_steps}")
    for k in ("critic_seed_epochs", "checkpoint_every", "keep_checkpoints", "eval_every", "sft_epochs"):
      check(getattr(self, k) > 0, f"{p}.{k}", f"must be > 0, got {getattr(self, k)}")
    check(self.micro_batch >= 0, f"{p}.micro_batch", f"must be >= 0, got {self.micro_batch}")


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
      check(self.rollout.global_batch % shards == 0, "rollout.global_batch",
             f"must be divisible by the mesh's batch shards (data x fsdp = {shards}), "
             f"got {self.rollout.global_batch}")
    check(not self.rsr.corpus_procedures or self.env.max_turns >= 3, "rsr.corpus_procedures",
          f"needs env.max_turns >= 3 (a procedure is read, act, done), got env.max_turns {self.env.max_turns}")

  def to_dict(self) -> dict:
    return _to_plain(self)


def _to_plain(obj):
  if dataclasses.is_dataclass(obj):
    return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
  if isinstance(obj, Mapping):
    return {k: _to_plain(v) for k, v in obj.items()}
  if isinstance(obj, tuple):
    return [_to_plain(v) for v in obj]
  return obj
