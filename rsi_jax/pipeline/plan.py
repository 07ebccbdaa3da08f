"""The phase plan and the pre-flight checks: what a run will do, checked before any model is built.

:func:`build_plan` turns ``pipeline.phases`` into one :class:`PhaseSpec` per phase (its config and where its
weights come from); :func:`preflight` checks everything that can be checked before a model is built (the mesh, the
batch, the reward tables, the templates, the checkpoints to start from, the output folders, the task pools,
``run.resume``), each failure a one-line :class:`PreflightError`.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

import jax

from rsi_jax.config import (Config, ConfigError, _deep_merge, _to_plain, load_phase_overlay, phase_kind,
                            with_overrides)
from rsi_jax.models.checkpoint import resolve_checkpoint
from rsi_jax.pipeline.run_folder import checkpoint_root, existing_run, run_dir_of
from rsi_jax.env.rollouts import pick_tasks

PREVIOUS, INIT = "previous", "init"


class PreflightError(ValueError):
  """The run cannot start (before any model is built); the message is one line saying why."""


@dataclasses.dataclass(frozen=True)
class PhaseSpec:
  name: str
  kind: str  # rsr | critic_seed | rpr
  cfg: Config  # the phase's config (overlay, phase_overrides, command line)
  actor_from: str  # previous | init | a checkpoint folder
  critic_from: str


def phase_config(cfg: Config, phase: str, cli_overrides: Sequence[str] = ()) -> Config:
  """The config a phase runs with: ``cfg`` (base file, run file, command line) with the shipped phase file
  ``configs/phases/<phase>.yml`` applied where the user's files and command line set nothing (what a run file
  says wins over the shipped phase files), then ``pipeline.phase_overrides[phase]`` (how a run file sets a
  value for one phase), then the command-line overrides again, so a ``key=value`` wins over everything."""
  try:
    tree = _deep_merge(load_phase_overlay(phase, cfg, cli_overrides),
                       _to_plain(cfg.pipeline.phase_overrides.get(phase, {})))
    return with_overrides(with_overrides(cfg, tree), cli_overrides)
  except ConfigError as e:
    raise ConfigError(f"phase {phase}: {e}") from None


def build_plan(cfg: Config, cli_overrides: Sequence[str] = ()) -> list[PhaseSpec]:
  """The phases of ``pipeline.phases`` with their configs and weight sources (ConfigError names the key)."""
  plan = []
  for name in cfg.pipeline.phases:
    kind = phase_kind(name)
    pcfg = phase_config(cfg, name, cli_overrides)
    critic_default = INIT if kind == "critic_seed" else PREVIOUS
    plan.append(PhaseSpec(name, kind, pcfg, str(cfg.pipeline.actor_from.get(name, PREVIOUS)),
                          str(cfg.pipeline.critic_from.get(name, critic_default))))
  return plan


def preflight(cfg: Config, cli_overrides: Sequence[str] = (), num_devices: int | None = None) -> list[PhaseSpec]:
  """Everything that can be checked before a model is built, each failure a one-line PreflightError."""
  from rsi_jax.models.mesh import resolve_parallelism
  from rsi_jax.rl.divisors import divisor_table_from_config

  try:
    plan = build_plan(cfg, cli_overrides)
  except ConfigError as e:
    raise PreflightError(str(e)) from None
  n_dev = jax.device_count() if num_devices is None else num_devices
  for spec in plan:
    c = spec.cfg
    try:
      ici, dcn = resolve_parallelism(c, n_dev)
    except ConfigError as e:
      hint = ""
      if jax.default_backend() == "cpu":
        hint = (f" (on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N gives N devices; this process "
                f"has {n_dev})")
      raise PreflightError(f"{e}{hint}") from None
    shards = (ici["ici_data_parallelism"] * ici["ici_fsdp_parallelism"] * dcn["dcn_data_parallelism"]
              * dcn["dcn_fsdp_parallelism"])
    if c.rollout.global_batch % shards:
      raise PreflightError(f"rollout.global_batch: {c.rollout.global_batch} is not divisible by the mesh's "
                           f"batch shards (data x fsdp = {shards} on {n_dev} devices) in phase {spec.name}")
    if c.rollout.global_batch < jax.process_count():
      raise PreflightError(f"rollout.global_batch: {c.rollout.global_batch} episodes do not give each of the "
                           f"{jax.process_count()} processes one (phase {spec.name})")
    if spec.kind != "rsr":
      try:
        table = divisor_table_from_config(c.reward)
      except (OSError, ValueError, TypeError, KeyError) as e:
        raise PreflightError(f"reward.divisor_table: cannot read {c.reward.divisor_table!r} (phase "
                             f"{spec.name}): {e}") from None
      if table.kind != c.reward.kind:
        raise PreflightError(f"reward.divisor_table: {c.reward.divisor_table} is a table for {table.kind!r} "
                             f"rewards but phase {spec.name} uses reward.kind={c.reward.kind!r} (set the "
                             f"table per phase with pipeline.phase_overrides)")
    if spec.kind == "rsr":
      from rsi_jax.rsr.runbook import load_template
      for key in ("plan_template", "exec_template") + (("judge_template",) if c.rsr.judge else ()):
        try:
          load_template(getattr(c.rsr, key))
        except FileNotFoundError as e:
          raise PreflightError(f"rsr.{key} (phase {spec.name}): {e}") from None
    for src_key, src in (("actor_from", spec.actor_from), ("critic_from", spec.critic_from)):
      if src not in (PREVIOUS, INIT):
        try:
          resolve_checkpoint(src)
        except FileNotFoundError as e:
          raise PreflightError(f"pipeline.{src_key}.{spec.name}: {e}") from None
  if cfg.model.hf_path:
    from rsi_jax.models.hf_import import HFImportError, check_hf_folder
    try:
      check_hf_folder(cfg.model.hf_path, cfg)
    except HFImportError as e:
      raise PreflightError(f"model.hf_path: {e}") from None
  check_output_location(run_dir_of(cfg), "run.output_dir")
  if cfg.pipeline.checkpoint_dir:
    check_output_location(checkpoint_root(cfg), "pipeline.checkpoint_dir")
  for _, c in sorted({(c.env.tasks_dir, c.env.strict_tasks): c for c in [cfg] + [s.cfg for s in plan]}.items()):
    load_pool(c)
  if cfg.run.resume == "never":
    found = existing_run(cfg)
    if found:
      raise PreflightError(f"run.resume=never but the run folder {run_dir_of(cfg)} already holds a run "
                           f"({', '.join(found)}): choose another run.name or use run.resume=auto")
  return plan


def check_output_location(path: str, key: str):
  """A local output folder must be creatable and writable (its nearest existing parent writable); an object-store
  URL is left to its backend."""
  from rsi_jax.cli import output_folder_problem
  problem = output_folder_problem(path)
  if problem:
    raise PreflightError(f"{key}: {problem}")


def runs_episodes(plan) -> bool:
  """Whether a phase plan runs any episode: a phase other than an RSR phase on the generated corpus
  (``rsr.policy: corpus``), or an in-training evaluation (``eval.tasks_dir``)."""
  return any(s.kind != "rsr" or s.cfg.rsr.policy != "corpus" or s.cfg.eval.tasks_dir for s in plan)


def environment(cfg: Config, plan):
  """The run's environment: an :class:`~rsi_jax.env.pool.EnvPool` on ``env.docker_hosts``, or, for a plan that
  runs no episode (e.g. ``configs/stand_in_base.yml``), a :class:`~rsi_jax.env.pool.NoEnvPool` (no Docker)."""
  from rsi_jax.env.pool import EnvPool, NoEnvPool
  if not runs_episodes(plan):
    return NoEnvPool()
  return EnvPool.from_config(cfg.env, f"{cfg.run.name}-{uuid.uuid4().hex[:6]}",
                             hygiene_patterns=cfg.reward.hygiene_patterns)


def load_pool(c: Config, images=None) -> tuple[list, list]:
  """(task pool, refused folders) of a (phase) config: the folders of ``env.tasks_dir`` that load
  (:func:`rsi_jax.env.tasks.load_suite`; ``images``: the base-image check against the run's Docker endpoints), then
  ``env.max_tasks`` of them, round-robin over families. ``env.strict_tasks``: the first refused folder stops the
  run; a suite where nothing loads always does (PreflightError)."""
  from rsi_jax.env.tasks import TaskError, load_suite
  try:
    suite = load_suite(c.env.tasks_dir, strict=c.env.strict_tasks, images=images)
  except TaskError as e:
    raise PreflightError(f"env.tasks_dir: {e}") from None
  if not suite.tasks:
    first = suite.refused[0]
    raise PreflightError(f"env.tasks_dir: {c.env.tasks_dir}: no task loaded, all {len(suite.refused)} folder(s) "
                         f"refused (first: {first.task}: {first.reason})")
  return pick_tasks(suite.tasks, c.env.max_tasks), suite.refused
