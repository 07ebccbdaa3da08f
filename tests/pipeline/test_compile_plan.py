"""The pod compile plan (python -m rsi_jax.pipeline.compile_plan): the tiny config compiled for a TPU v5e 2x2
slice on this CPU machine (libtpu from .venv/libtpu), its memory report checked against the sizes of the
state it holds; an oversized config is reported as not fitting, with numbers."""

import json
import math
import os
import subprocess
import sys

import jax
import pytest

from rsi_jax.config import CONFIG_DIR, REPO_ROOT

pytestmark = pytest.mark.slow
GIB = 1 << 30


def _plan(*args):
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  return subprocess.run([sys.executable, "-m", "rsi_jax.pipeline.compile_plan", *args], cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=900, env=env, check=False)


def _param_count(cfg):
  from rsi_jax.models import Actor
  from rsi_jax.models.mesh import build_mesh
  mesh = build_mesh(cfg, jax.devices()[:1])
  return sum(math.prod(a.shape) for a in jax.tree.leaves(Actor(cfg, mesh).abstract_params))


def test_tiny_config_fits_a_v5e_slice_and_reports_its_memory():
  r = _plan(f"--config={CONFIG_DIR / 'smoke.yml'}", "--topology=v5e:2x2", "--json")
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert out["devices"] == 4 and out["device_kind"] == "TPU v5 lite" and out["hbm_bytes"] == 16 * GIB
  assert out["mesh"] == {"fsdp": 2, "tensor": 2} and out["pass_tokens"] == 8192 and out["pass_rows"] == 2
  progs = {p["name"]: p for p in out["programs"]}
  assert set(progs) == {"critic_only_step", "joint_ppo_step", "joint_ppo_pass", "sft_step", "prepare_forward",
                        "sampler_prefill", "sampler_decode"}
  assert out["fits"] and all(p["fits"] and 0 < p["total"] < 16 * GIB for p in progs.values())
  # the joint step's arguments hold actor + critic params and two AdamW moments each (float32), sharded over
  # at most the 4 chips and at least replicated nowhere beyond one full copy, plus the batch
  from rsi_jax.config import load_config
  n = _param_count(load_config(CONFIG_DIR / "smoke.yml", ["mesh.ici_tensor_parallelism=1",
                                                          "mesh.ici_fsdp_parallelism=1"]))
  state = 2 * 3 * 4 * n  # (actor + critic) x (params, mu, nu) x float32
  joint = progs["joint_ppo_step"]
  assert state / 4 <= joint["argument"] <= state + (64 << 20)
  assert joint["alias"] >= 0.9 * (joint["argument"] - (64 << 20))  # the donated state is updated in place
  # the SFT step holds the actor only
  assert progs["sft_step"]["argument"] < 0.6 * joint["argument"]
  # the accumulating pass holds the float32 gradient accumulator: one copy of both roles' params, sharded
  assert state / 3 / 4 <= progs["joint_ppo_pass"]["held"] <= state / 3
  # the sampler (sampler.num_devices = 1 chip) holds a whole copy of the actor's weights and the KV pool,
  # which its steps update in place, while the learner's state stays resident on the same chip
  from rsi_jax.sampler.factory import build_engine
  engine = build_engine(load_config(CONFIG_DIR / "smoke.yml"))
  weights = sum(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(engine._abs_params))
  pool = engine.kv_bytes
  small = 1 << 20  # tokens, positions, keys, block tables
  for name in ("sampler_prefill", "sampler_decode"):
    p = progs[name]
    assert weights + pool <= p["argument"] <= weights + pool + small, name
    assert pool <= p["alias"] <= pool + small, name
    assert joint["argument"] - (64 << 20) <= p["held"] <= joint["argument"], name


def test_oversized_config_does_not_fit_with_numbers():
  big = ["model.base_emb_dim=8192", "model.base_mlp_dim=32768", "model.base_num_query_heads=64",
         "model.base_num_kv_heads=8", "model.head_dim=128", "model.base_num_decoder_layers=8"]
  r = _plan(f"--config={CONFIG_DIR / 'smoke.yml'}", "--topology=v5e:2x2", "--programs=joint_ppo_step", *big)
  assert r.returncode == 1, r.stderr[-3000:]
  line = next(x for x in r.stdout.splitlines() if x.startswith("joint_ppo_step"))
  assert "DOES NOT FIT: over by" in line and "x HBM" in line
  assert r.stdout.strip().endswith("verdict: does not fit")
  # ~8.9B parameters per role: (actor + critic) x 3 float32 copies over 4 chips ~ 53 GB of arguments
  args_gib = float(line.split()[1])
  assert 40 < args_gib < 60


def test_unknown_program_and_topology_are_errors():
  r = _plan(f"--config={CONFIG_DIR / 'smoke.yml'}", "--programs=warp_step")
  assert r.returncode == 2 and "--programs: unknown ['warp_step']" in r.stderr
  r = _plan(f"--config={CONFIG_DIR / 'smoke.yml'}", "--topology=v9z:2x2")
  assert r.returncode == 2 and "topology 'v9z:2x2'" in r.stderr
