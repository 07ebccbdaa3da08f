"""Pod compile plan: does a config fit the chips, before renting them?

    python -m rsi_jax.pipeline.compile_plan --config=FILE [--topology=v5p:2x2x2] [--hbm_gib=G] [--json]
        [--programs=joint_ppo_step,sft_step] [key=value ...]

Builds shape-only (abstract) actor, critic and optimizer states and the largest learner pass a step can run
(a row per data shard of ``rl.per_device_token_budget`` x context tokens, or of ``sampler.max_cache_length``
when that is longer: a sample longer than the budget has a row of its own; without packing, every sample of
the global batch at that length), on the config's mesh over the target devices, then lowers and compiles,
without allocating a weight, the programs a run executes:

* ``critic_only_step``: a critic-only update (the first steps of an RPR phase);
* ``joint_ppo_step``: the joint PPO + value update, one pass (fused with the optimizer update);
* ``joint_ppo_pass``: one accumulating pass of a multi-pass update (gradients out, the float32 accumulator of
  the earlier passes held alongside: counted in ``held``);
* ``sft_step``: the RSR actor-only SFT update;
* ``prepare_forward``: π_old / v_old of one pass;
* ``sampler_prefill`` / ``sampler_decode``: the rollout sampler's prompt prefill (paged: one
  ``sampler.prefill_chunk`` chunk into the KV pool; slot / maxtext: a ``sampler.max_prefill_length`` prompt)
  and its ``sampler.decode_steps`` decode steps for all ``sampler.num_slots`` slots, on the sampler's mesh
  (the first ``sampler.num_devices`` devices, which it shares with the learner: the learner's weights and
  optimizer states stay resident there during rollouts and are counted in ``held``).

For each it prints XLA's per-device argument / temporary / output bytes (minus donated aliases, plus
``held``) against the chip's HBM, with a verdict (fits / does not fit, by how much). The loss reads the LM
head at every position of the pass (the most a pass can ask for).

``--topology``: a TPU slice by name (``v4:2x2x1``, ``v5e:2x2``, ``v5p:2x2x2``, ``v6e:4x4``, ...) through
``jax.experimental.topologies``; this needs libtpu (a TPU VM has it; elsewhere ``scripts/setup.sh`` keeps the
pinned release in ``.venv/libtpu``, outside the environment's import path so CPU runs do not probe for a TPU,
and this command adds it). Without ``--topology``: this machine's devices (GPU, or CPU: as many virtual devices
as the config's mesh needs unless ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` sets the count). HBM
per chip comes from the device kind (TPU), the device's memory statistics (GPU), or ``--hbm_gib``.

Exit status: 0 every program fits, 1 one does not, 2 a usage, config or topology error (one line).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
from pathlib import Path

from absl import flags

from rsi_jax import cli

GIB = 1 << 30
# HBM per chip (GiB) by JAX device kind
HBM_GIB = {"TPU v4": 32, "TPU v5 lite": 16, "TPU v5e": 16, "TPU v5p": 95, "TPU v5": 95, "TPU v6 lite": 32,
           "TPU v6e": 32, "TPU7x": 192}


def _libtpu_path() -> Path:
  return Path(sys.prefix) / "libtpu"


def _use_tpu_compiler(topology: str):
  """Make libtpu importable (the copy setup.sh keeps outside the import path) and, off a TPU VM, keep this
  process's own backend on the CPU and tell libtpu what it would otherwise probe the machine for."""
  try:
    import libtpu  # noqa: F401
    return  # a TPU environment: leave it as it is
  except ImportError:
    pass
  p = _libtpu_path()
  if not p.is_dir():
    raise PlanError(f"--topology needs libtpu: install rsi_jax[tpu] or run scripts/setup.sh (which keeps it "
                    f"in {p})")
  sys.path.insert(0, str(p))
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  gen, _, shape = topology.partition(":")
  chips = math.prod(int(x) for x in shape.split("x") if x.isdigit()) or 1
  accel = {"v5e": f"v5litepod-{chips}", "v6e": f"v6e-{chips}"}.get(gen, f"{gen}-{2 * chips}")
  for k, v in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_WORKER_HOSTNAMES", "localhost"), ("TPU_ACCELERATOR_TYPE", accel)):
    os.environ.setdefault(k, v)


class PlanError(Exception):
  """A topology or environment error (exit status 2)."""


@dataclasses.dataclass
class Program:
  name: str
  argument: int
  temp: int
  output: int
  alias: int
  held: int = 0
  note: str = ""

  @property
  def total(self) -> int:
    return self.argument + self.temp + self.output - self.alias + self.held


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def compile_oom_bytes(message: str) -> int | None:
  """The temporaries XLA's TPU compiler says a program needs when it refuses it for lack of HBM, else None."""
  m = re.search(r"required for HLO temporaries \(([\d.]+)([KMGT]?)i?B?\)", message)
  return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None


def _shard_bytes(a) -> int:
  shape = a.sharding.shard_shape(a.shape) if getattr(a, "sharding", None) is not None else a.shape
  return math.prod(shape) * a.dtype.itemsize


def hbm_bytes(device, override_gib: float | None) -> int | None:
  if override_gib:
    return int(override_gib * GIB)
  kind = str(getattr(device, "device_kind", ""))
  for k in sorted(HBM_GIB, key=len, reverse=True):
    if kind.startswith(k):
      return HBM_GIB[k] * GIB
  try:
    return int(device.memory_stats()["bytes_limit"])
  except Exception:  # CPU devices have no memory statistics
    return None


def target_devices(topology: str | None):
  import jax
  if not topology:
    return jax.devices()
  from jax.experimental import topologies
  try:
    return topologies.get_topology_desc(topology_name=topology, platform="tpu").devices
  except Exception as e:
    raise PlanError(f"topology {topology!r}: {e}") from None


def pass_shape(cfg, mesh) -> tuple[int, int]:
  """(rows, T) of the largest learner pass a step can run: packed rows of the row budget, or a row of its
  own for a sample as long as ``sampler.max_cache_length`` (prompt + generation), whichever is longer;
  without packing, every shard's share of the global batch at that length."""
  from rsi_jax.models.mesh import batch_shards
  from rsi_jax.pipeline.rpr import row_budget
  from rsi_jax.rl.packing import unpacked_rows_per_shard
  rl, shards = cfg.rl, batch_shards(mesh)
  longest = -(-cfg.sampler.max_cache_length // rl.pad_multiple) * rl.pad_multiple
  if rl.per_device_token_budget:
    return shards, max(row_budget(cfg, mesh), longest)
  per_shard = -(-cfg.rollout.global_batch // shards)
  return shards * unpacked_rows_per_shard(per_shard, cfg.pipeline.micro_batch), longest


PROGRAMS = ("critic_only_step", "joint_ppo_step", "joint_ppo_pass", "sft_step", "prepare_forward",
            "sampler_prefill", "sampler_decode")
SAMPLER_PROGRAMS = ("sampler_prefill", "sampler_decode")


def build_plan(cfg, devices, programs=PROGRAMS) -> tuple[list[Program], dict]:
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec

  from rsi_jax.models import Actor, Critic
  from rsi_jax.models.mesh import batch_sharding, build_mesh
  from rsi_jax.models.optim import TrainState, make_train_step, masked_nll_loss, opt_state_shardings
  from rsi_jax.pipeline.rpr import RPRTrainer

  mesh = build_mesh(cfg, devices)
  actor, critic = Actor(cfg, mesh), Critic(cfg, mesh)
  trainer = RPRTrainer(cfg, actor, critic)
  rep = NamedSharding(mesh, PartitionSpec())
  rows, t = pass_shape(cfg, mesh)

  def sds(shape, dtype, sharding):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

  def opt_abstract(opt, model):
    shapes = jax.eval_shape(opt.init, model.abstract_params)
    sh = opt_state_shardings(opt, model.abstract_params, model.param_shardings, mesh)
    return jax.tree.map(lambda a, s: sds(a.shape, a.dtype, s), shapes, sh)

  a_abs, c_abs = actor.abstract_params, critic.abstract_params
  a_opt, c_opt = opt_abstract(trainer.actor_opt, actor), opt_abstract(trainer.critic_opt, critic)
  step = sds((), jnp.int32, rep)
  bs = batch_sharding(mesh)
  ints = {k: sds((rows, t), jnp.int32, bs) for k in ("tokens", "positions", "segment_ids", "loss_index")}
  floats = {k: sds((rows, t), jnp.float32, bs) for k in ("gen_mask", "old_logp", "advantages", "old_values",
                                                         "returns")}
  batch = {**ints, **floats, "num_samples": sds((), jnp.float32, rep)}
  fwd_batch = {k: batch[k] for k in ("tokens", "positions", "segment_ids", "loss_index")}
  sft_batch = {**fwd_batch, "mask": batch["gen_mask"], "num_samples": batch["num_samples"]}
  sft = make_train_step(actor, trainer.actor_opt, masked_nll_loss(actor))

  def measure(name, fn, args, held=0):
    try:
      ma = fn.lower(*args).compile().memory_analysis()
    except Exception as e:  # the TPU compiler refuses programs that cannot fit (CompileTimeHbmOom)
      temp = compile_oom_bytes(str(e))
      if temp is None:
        raise
      # arguments from the input shapes; outputs are the donated state (aliased) or small
      arg_bytes = sum(_shard_bytes(a) for a in jax.tree.leaves(args) if hasattr(a, "shape"))
      return Program(name, arg_bytes, temp, 0, 0, held, note="the compiler's out-of-memory report: temporaries")
    return Program(name, int(ma.argument_size_in_bytes), int(ma.temp_size_in_bytes),
                   int(ma.output_size_in_bytes), int(ma.alias_size_in_bytes), held)

  def grad_bytes(params_abs):  # the float32 accumulator, per device
    return sum(math.prod(s.sharding.shard_shape(s.shape)) * 4 for s in jax.tree.leaves(params_abs))

  joint = TrainState(a_abs, a_opt, c_abs, c_opt, step)
  lowerings = {
      "critic_only_step": (trainer._critic_step._step, (TrainState(a_abs, None, c_abs, c_opt, step), batch)),
      "joint_ppo_step": (trainer._joint_step._step, (joint, batch)),
      "joint_ppo_pass": (trainer._joint_step._grads, (joint, batch)),
      "sft_step": (sft._step, (TrainState(a_abs, a_opt, None, None, step), sft_batch)),
      "prepare_forward": (trainer._forward, (a_abs, c_abs, fwd_batch)),
  }
  held = {"joint_ppo_pass": grad_bytes(a_abs) + grad_bytes(c_abs)}
  if any(n in programs for n in SAMPLER_PROGRAMS):
    resident = sum(_shard_bytes(a) for a in jax.tree.leaves((a_abs, a_opt, c_abs, c_opt)))
    sampler, extra = sampler_lowerings(cfg, devices)
    lowerings.update(sampler)
    held.update({n: resident + extra.get(n, 0) for n in SAMPLER_PROGRAMS})
  progs = [measure(n, *lowerings[n], held.get(n, 0)) for n in PROGRAMS if n in programs]
  info = {"mesh": {k: int(v) for k, v in mesh.shape.items() if v > 1} or {"data": 1},
          "pass_rows": rows, "pass_tokens": t, "devices": len(devices),
          "device_kind": str(getattr(devices[0], "device_kind", devices[0].platform))}
  return progs, info


def sampler_lowerings(cfg, devices) -> tuple[dict, dict]:
  """The sampler's prefill and decode programs with shape-only arguments on its mesh (the first
  ``sampler.num_devices`` of ``devices``), and the bytes per device each holds beyond its arguments (slot /
  maxtext prefill: the decode state it will be inserted into)."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from rsi_jax.config import ConfigError
  from rsi_jax.sampler.engine import HEAD_KEY
  from rsi_jax.sampler.factory import build_engine
  s = cfg.sampler
  if s.num_devices > len(devices):
    raise ConfigError(f"sampler.num_devices={s.num_devices} exceeds the {len(devices)} target devices")
  # the lowest device ids: the TPU compiler takes a program on k devices of a larger slice only as ids 0..k-1
  engine = build_engine(cfg, sorted(devices, key=lambda d: d.id)[:s.num_devices])
  rep = engine._replicated

  def sds(shape, dtype, sharding=rep):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

  params = jax.tree.map(lambda a, sh: sds(a.shape, a.dtype, sh), nnx.to_pure_dict(engine._abs_params),
                        engine.param_shardings)
  if engine._head_copy:  # CPU: the sampler keeps an (E, V) copy of a tied head
    emb = params["token_embedder"]["embedding"]
    params[HEAD_KEY] = sds(emb.shape[::-1], emb.dtype)
  shapes = jax.eval_shape(engine.init_decode_state)
  state = jax.tree.map(lambda a, sh: sds(a.shape, a.dtype, sh), shapes, engine._state_shardings)
  key_t = jax.random.key(0).dtype
  i32, f32 = jnp.int32, jnp.float32
  steps = int(s.decode_steps)
  if s.decode_impl == "paged":
    width = engine.table_width
    prefill = (engine._chunk_jit, (params, state, sds((engine.chunk_size,), i32), sds((), i32), sds((), i32),
                                   sds((width,), i32), sds((), i32), sds((), key_t), sds((), f32), sds((), i32),
                                   sds((), f32), sds((), jnp.bool_)))
    # the attention path of a call that may read any position of the table (the plan for read_blocks None)
    decode = (engine._paged_steps_jit, (params, state, sds((engine.num_slots, width), i32), steps,
                                        engine.attention_plan(None)))
    extra = {}
  else:
    one = lambda dt: sds((1,), dt)
    prefill = (engine._prefill_jit, (params, sds((1, engine.max_prefill_length), i32), sds((), i32), one(key_t),
                                     one(f32), one(i32), one(f32)))
    decode = (engine._generate_steps_jit, (params, state, steps))
    extra = {"sampler_prefill": sum(_shard_bytes(a) for a in jax.tree.leaves(state))}
  return {"sampler_prefill": prefill, "sampler_decode": decode}, extra


def report(progs: list[Program], info: dict, hbm: int | None, label: str) -> tuple[str, dict]:
  gib = lambda b: f"{b / GIB:8.2f}"
  lines = [f"compile plan: {label}: {info['devices']} x {info['device_kind']}"
           + (f", {hbm / GIB:.1f} GiB HBM each" if hbm else ", HBM unknown (--hbm_gib)"),
           f"mesh {info['mesh']}; learner pass {info['pass_rows']} rows x {info['pass_tokens']:,} tokens",
           f"{'program':18s} {'args GiB':>9s} {'temp GiB':>9s} {'out GiB':>9s} {'alias':>9s} {'held':>9s} "
           f"{'total':>9s}  verdict"]
  rows = []
  for p in progs:
    fits = None if hbm is None else p.total <= hbm
    if fits is None:
      verdict = "unknown"
    elif fits:
      verdict = f"fits ({100 * p.total / hbm:.0f}% of HBM, {(hbm - p.total) / GIB:.2f} GiB free)"
    else:
      verdict = f"DOES NOT FIT: over by {(p.total - hbm) / GIB:.2f} GiB ({p.total / hbm:.2f}x HBM)"
    lines.append(f"{p.name:18s} {gib(p.argument)} {gib(p.temp)} {gib(p.output)} {gib(p.alias)} {gib(p.held)} "
                 f"{gib(p.total)}  {verdict}" + (f" [{p.note}]" if p.note else ""))
    rows.append({**dataclasses.asdict(p), "total": p.total, "fits": fits,
                 "margin": None if hbm is None else hbm - p.total})
  ok = all(r["fits"] is not False for r in rows)
  lines.append("verdict: " + ("fits" if ok and hbm else "does not fit" if not ok else "unknown (no HBM size)"))
  return "\n".join(lines), {**info, "label": label, "hbm_bytes": hbm, "programs": rows, "fits": ok}


PROG = "python -m rsi_jax.pipeline.compile_plan"
FLAGS = cli.flag_values()
flags.DEFINE_string("config", "", "Run config file (YAML; required).", flag_values=FLAGS)
flags.DEFINE_string("topology", "", "TPU slice, e.g. v5p:2x2x2 (default: this machine's devices).", flag_values=FLAGS)
flags.DEFINE_float("hbm_gib", None, "HBM per chip in GiB (overrides the device's).", lower_bound=0.0,
                   flag_values=FLAGS)
flags.DEFINE_bool("json", False, "Print one JSON object instead of the table.", flag_values=FLAGS)
flags.DEFINE_list("programs", list(PROGRAMS), f"A subset of {','.join(PROGRAMS)}.", flag_values=FLAGS)


def main(argv=None) -> int:
  overrides = cli.parse(FLAGS, argv, PROG, __doc__)
  names = [n for n in FLAGS.programs if n]
  unknown = sorted(set(names) - set(PROGRAMS))
  if not FLAGS.config:
    cli.fail(PROG, "--config: required (the run config to plan)")
  if unknown:
    cli.fail(PROG, f"--programs: unknown {unknown} (known: {list(PROGRAMS)})")
  from rsi_jax.config import ConfigError, load_config
  try:
    if FLAGS.topology:
      _use_tpu_compiler(FLAGS.topology)
    cfg = load_config(FLAGS.config, overrides)
    if not FLAGS.topology:
      cli.provide_cpu_devices(cfg.mesh)  # before JAX starts its backends
    devices = target_devices(FLAGS.topology)
    progs, info = build_plan(cfg, devices, names)
  except (ConfigError, PlanError) as e:
    print(f"compile_plan: {e}", file=sys.stderr)
    return 2
  hbm = hbm_bytes(devices[0], FLAGS.hbm_gib)
  text, data = report(progs, info, hbm, f"{FLAGS.config} on {FLAGS.topology or 'local devices'}")
  print(json.dumps(data) if FLAGS.json else text)
  return 0 if data["fits"] else 1


if __name__ == "__main__":
  sys.exit(main())
