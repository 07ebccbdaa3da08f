"""Config system: YAML chain + model files + key=value overrides -> one validated, immutable Config."""

import dataclasses

import pytest
import yaml

from rsi_jax.config import (CONFIG_DIR, Config, ConfigError, build_config, dump_config, load_config,
                            load_phase_overlay, with_overrides)
from rsi_jax.pipeline.plan import phase_config

SMOKE = CONFIG_DIR / "smoke.yml"


def test_smoke_config_loads_with_model_and_inheritance():
  cfg = load_config(SMOKE)
  assert cfg.run.name == "smoke"
  assert cfg.model.name == "qwen3-tiny" and cfg.model.base_emb_dim == 64
  # inherited from base.yml, not set in smoke.yml
  assert cfg.rl.clip_low == 0.30 and cfg.rl.clip_high == 5.00 and cfg.rl.value_clip == 4.00
  assert cfg.critic_optim.grad_clip == 100.0 and cfg.actor_optim.grad_clip == 1.0


def test_paper_defaults():
  cfg = Config()
  assert (cfg.actor_optim.b1, cfg.actor_optim.b2, cfg.actor_optim.eps, cfg.actor_optim.weight_decay) == (
      0.90, 0.98, 1e-8, 0.10)
  assert cfg.actor_optim.learning_rate == 5e-7 and cfg.critic_optim.learning_rate == 1.5e-5
  assert cfg.pipeline.rollout_steps == 36 and cfg.pipeline.critic_only_steps == 4
  # one optimizer update per rollout step (App. A), so Warmup_4 is 4 critic-only updates
  assert cfg.rl.minibatches == 1 and cfg.rl.ppo_epochs == 1
  assert cfg.rollout.max_staleness == 1 and cfg.rollout.responses_per_task == 1
  assert not cfg.actor_optim.decay_norms_and_biases and not cfg.critic_optim.decay_norms_and_biases
  assert cfg.rollout.global_batch == 256 and cfg.rollout.requested == 288
  assert cfg.reward.fallback_divisor == 82.0 and cfg.env.summarize_threshold_tokens == 32_000


def test_base_yml_lists_exactly_the_schema():
  """configs/base.yml documents every key; a field added to the schema must appear there (and vice versa)."""
  base = yaml.safe_load((CONFIG_DIR / "base.yml").read_text())
  base.pop("model_name")
  schema = Config().to_dict()
  schema.pop("model")
  assert {k: sorted(v) for k, v in base.items()} == {k: sorted(v) for k, v in schema.items()}
  # and its values are the schema defaults
  assert build_config(base).to_dict() == build_config({}).to_dict()


@pytest.mark.parametrize("name", ["qwen3-tiny", "qwen3-0.6b", "qwen3-8b", "qwen3-32b"])
def test_model_files(name):
  cfg = load_config(SMOKE, [f"model_name={name}"])
  assert cfg.model.name == name
  assert cfg.model.base_num_query_heads % cfg.model.base_num_kv_heads == 0


def test_real_qwen3_shapes():
  m = load_config(None, ["model_name=qwen3-8b"]).model
  assert (m.base_emb_dim, m.base_num_decoder_layers, m.base_num_query_heads, m.base_num_kv_heads,
          m.head_dim, m.base_mlp_dim, m.logits_via_embedding) == (4096, 36, 32, 8, 128, 12288, False)
  m = load_config(None, ["model_name=qwen3-0.6b"]).model
  assert (m.base_emb_dim, m.base_num_decoder_layers, m.logits_via_embedding) == (1024, 28, True)


def test_overrides_types_and_raw_strings():
  cfg = load_config(SMOKE, ["actor_optim.learning_rate=3e-7", "run.name=007", "rollout.top_k=5",
                            "env.image_map={ubuntu:24.04: rsi-base}", "reward.hygiene_patterns=[^lint, ^fmt]",
                            "sampler.prefill_buckets=[16,32]", "run.progress=false"])
  assert cfg.actor_optim.learning_rate == 3e-7
  assert cfg.run.name == "007"  # str fields get the raw text, not YAML's int 7
  assert cfg.rollout.top_k == 5 and cfg.run.progress is False
  assert dict(cfg.env.image_map) == {"ubuntu:24.04": "rsi-base"}
  assert cfg.reward.hygiene_patterns == ("^lint", "^fmt") and cfg.sampler.prefill_buckets == (16, 32)


def test_a_quoted_string_override_is_the_string_inside_the_quotes():
  cfg = load_config(SMOKE, ["eval.tasks_dir=''", 'run.name="007"', "run.output_dir= 'a b' "])
  assert cfg.eval.tasks_dir == "" and cfg.run.name == "007" and cfg.run.output_dir == "a b"
  assert load_config(SMOKE, ["eval.tasks_dir="]).eval.tasks_dir == ""
  assert load_config(SMOKE, ["run.name='it''s'"]).run.name == "it's"  # YAML's quoting rules
  assert load_config(SMOKE, ["run.name=a'b'"]).run.name == "a'b'"  # quotes inside the text are kept


def test_config_is_immutable():
  cfg = load_config(SMOKE)
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.rl.clip_low = 0.1
  with pytest.raises(TypeError):
    cfg.env.image_map["x"] = "y"


def test_phase_overlays():
  cfg = load_config(SMOKE)
  rpr2 = with_overrides(cfg, load_phase_overlay("rpr2"))
  assert rpr2.reward.kind == "spr" and rpr2.actor_optim.learning_rate == 1e-7
  assert rpr2.pipeline.checkpoint_every == 2
  rpr1 = with_overrides(cfg, load_phase_overlay("rpr1"))
  assert rpr1.reward.kind == "fdr" and rpr1.actor_optim.learning_rate == 5e-7
  assert cfg.reward.kind == "fdr"  # the original is untouched
  assert load_phase_overlay("no-such-phase") == {}


def test_command_line_wins_over_phase_files():
  """A key=value given on the command line wins over configs/phases/<phase>.yml and phase_overrides; what the
  smoke run file leaves to the phase files (its RPR values it names in phase_overrides) comes from them."""
  cli = ["actor_optim.learning_rate=3e-3", "reward.kind=fdr", "pipeline.checkpoint_every=7"]
  cfg = load_config(SMOKE, cli)
  for phase in ("rpr1", "rpr2"):
    pc = phase_config(cfg, phase, cli)
    assert pc.actor_optim.learning_rate == 3e-3 and pc.reward.kind == "fdr" and pc.pipeline.checkpoint_every == 7
  plain = load_config(SMOKE)
  assert phase_config(plain, "rpr2").reward.kind == "spr"  # without the command line, the overlay applies
  assert phase_config(plain, "rpr1").actor_optim.learning_rate == 5e-7
  # phase_overrides (run file or command line) sit between the overlay file and plain command-line keys
  ov = ["pipeline.phase_overrides={rpr2: {actor_optim: {learning_rate: 2.0e-6}, rl: {ppo_epochs: 2}}}"]
  cfg = load_config(SMOKE, ov)
  assert phase_config(cfg, "rpr2", ov).actor_optim.learning_rate == 2e-6
  assert phase_config(cfg, "rpr2", ov).rl.ppo_epochs == 2 and phase_config(cfg, "rpr1", ov).rl.ppo_epochs == 1
  cli = ov + ["actor_optim.learning_rate=9e-9"]
  assert phase_config(load_config(SMOKE, cli), "rpr2", cli).actor_optim.learning_rate == 9e-9
  bad = ["pipeline.phase_overrides={rpr1: {rl: {clip_lo: 1}}}"]
  with pytest.raises(ConfigError, match=r"phase rpr1: rl\.clip_lo: unknown config key"):
    phase_config(load_config(SMOKE, bad), "rpr1", bad)


def _run_file(tmp_path, text: str, name: str = "run.yml"):
  f = tmp_path / name
  f.write_text(text)
  return f


def test_run_file_wins_over_shipped_phase_files(tmp_path):
  """What the user's files say (the run file chain, configs/base.yml aside) wins over configs/phases/*.yml;
  keys they leave alone still come from the phase file; pipeline.phase_overrides wins over the run file; the
  command line wins over all."""
  base = CONFIG_DIR / "base.yml"
  middle = _run_file(tmp_path, f"base_config: {base}\nreward: {{kind: fdr}}\n", "middle.yml")
  run = _run_file(tmp_path, f"base_config: {middle}\nactor_optim: {{learning_rate: 2.0e-5}}\n")
  cfg = load_config(run)
  assert cfg.user_keys() == {"reward.kind", "actor_optim.learning_rate"}  # base.yml's keys are not the user's
  rpr2 = phase_config(cfg, "rpr2")
  assert rpr2.actor_optim.learning_rate == 2e-5 and rpr2.reward.kind == "fdr"  # the run file chain's values
  assert rpr2.pipeline.checkpoint_every == 2 and rpr2.rl.dynamic_balancing and rpr2.pipeline.micro_batch == 1
  assert phase_config(cfg, "rpr1").actor_optim.learning_rate == 2e-5
  # a run file that sets nothing the phase file sets: the phase file's values, although base.yml sets them too
  plain = load_config(_run_file(tmp_path, f"base_config: {base}\nrun: {{name: plain}}\n", "plain.yml"))
  assert phase_config(plain, "rpr2").actor_optim.learning_rate == 1e-7
  assert phase_config(plain, "rpr2").reward.kind == "spr"
  assert phase_config(load_config(base), "rpr1").actor_optim.learning_rate == 5e-7  # base.yml alone: no user keys
  # the run file itself says otherwise for one phase: phase_overrides beats its run-wide value
  ov = _run_file(tmp_path, f"base_config: {run}\npipeline:\n  phase_overrides:\n    rpr2:\n"
                           f"      actor_optim: {{learning_rate: 3.0e-6}}\n", "ov.yml")
  cfg = load_config(ov)
  assert phase_config(cfg, "rpr2").actor_optim.learning_rate == 3e-6
  assert phase_config(cfg, "rpr1").actor_optim.learning_rate == 2e-5
  # the command line beats the run file, the phase file and phase_overrides
  cli = ["actor_optim.learning_rate=9e-9", "pipeline.checkpoint_every=7"]
  pc = phase_config(load_config(ov, cli), "rpr2", cli)
  assert pc.actor_optim.learning_rate == 9e-9 and pc.pipeline.checkpoint_every == 7 and pc.reward.kind == "fdr"
  # a section set whole on the command line takes the phase file's keys of that section out
  assert load_phase_overlay("rpr2", plain, ["rl={dynamic_balancing: false}"]) == {
      "reward": {"kind": "spr"}, "actor_optim": {"learning_rate": 1e-7},
      "pipeline": {"checkpoint_every": 2, "micro_batch": 1}}
  assert load_phase_overlay("rpr2") == {**load_phase_overlay("rpr2", plain, ["rl={dynamic_balancing: false}"]),
                                        "rl": {"dynamic_balancing": True}}


@pytest.mark.parametrize("name,expected", [
    ("smoke.yml", {"rsr1": (1e-4, 1), "critic_seed": (1e-4, 1), "rpr1": (5e-7, 5), "rsr2": (1e-4, 1),
                   "rpr2": (1e-7, 2)}),
    ("learn_check.yml", {"rsr0": (3e-3, 4), "rsr1": (3e-3, 4), "critic_seed": (3e-3, 4), "rpr1": (3e-4, 5)}),
])
def test_shipped_run_files_keep_their_per_phase_values(name, expected):
  """The actor learning rate and checkpoint cadence each phase of the shipped run files runs with (the values
  the phase files gave them over the run file before the run file won; RPR's are in their phase_overrides)."""
  cfg = load_config(CONFIG_DIR / name)
  got = {}
  for phase in cfg.pipeline.phases:
    pc = phase_config(cfg, phase)
    got[phase] = (pc.actor_optim.learning_rate, pc.pipeline.checkpoint_every)
  assert got == expected
  assert phase_config(cfg, "rpr1").reward.kind == "fdr"


def test_a_narrower_plan_leaves_the_run_files_other_phase_overrides_unused():
  """pipeline.phases=[...] on the command line may leave out phases the run file gives values of their own."""
  cli = ["pipeline.phases=[rsr1, rpr1]"]
  cfg = load_config(SMOKE, cli)
  assert "rpr2" in cfg.pipeline.phase_overrides
  assert phase_config(cfg, "rpr1", cli).actor_optim.learning_rate == 5e-7
  assert phase_config(cfg, "rsr1", cli).actor_optim.learning_rate == 1e-4
  with pytest.raises(ConfigError, match=r"pipeline\.phase_overrides\.rpr_1: unknown phase 'rpr_1'"):
    load_config(SMOKE, ["pipeline.phase_overrides={rpr_1: {rl: {ppo_epochs: 2}}}"])


def test_weight_sources_from_the_command_line():
  cfg = load_config(SMOKE, ["pipeline.actor_from.rpr1=gs://bucket/run/checkpoints/rsr1/40",
                            "pipeline.critic_from.rpr2=init"])
  assert dict(cfg.pipeline.actor_from) == {"rpr1": "gs://bucket/run/checkpoints/rsr1/40"}
  assert dict(cfg.pipeline.critic_from) == {"rpr2": "init"}


def test_dump_roundtrip():
  cfg = load_config(SMOKE, ["env.image_map={a: b}"])
  assert build_config(yaml.safe_load(dump_config(cfg))) == cfg


@pytest.mark.parametrize("overrides,key,msg", [
    (["foo=1"], "foo", "unknown config key"),
    (["rl.clip_lo=1"], "rl.clip_lo", "unknown config key"),
    (["rl.clip_low=abc"], "rl.clip_low", "expected a number"),
    (["rollout.global_batch=2.5"], "rollout.global_batch", "expected an integer"),
    (["run.progress=maybe"], "run.progress", "expected true/false"),
    (["actor_optim.learning_rate=-1"], "actor_optim.learning_rate", "must be >= 0"),
    (["critic_optim.grad_clip=0"], "critic_optim.grad_clip", "must be > 0"),
    (["rl.gamma_turn=1.5"], "rl.gamma_turn", "must be in [0, 1]"),
    (["rl.clip_low=1.0"], "rl.clip_low", "must be < 1"),
    (["rollout.global_batch=6", "mesh.ici_fsdp_parallelism=4"], "rollout.global_batch", "divisible"),
    (["rollout.requested=2"], "rollout.requested", "must be >= global_batch"),
    (["rollout.top_p=0"], "rollout.top_p", "must be in (0, 1]"),
    (["model.base_num_kv_heads=3"], "model.base_num_kv_heads", "must divide"),
    (["model.dtype=int8"], "model.dtype", "float32/bfloat16"),
    (["mesh.ici_data_parallelism=-1", "mesh.ici_fsdp_parallelism=-1"], "mesh", "at most one mesh axis may be -1"),
    (["mesh.ici_tensor_parallelism=0"], "mesh.ici_tensor_parallelism", "must be >= 1 or -1"),
    (["pipeline.phases=[rsr1, ppo]"], "pipeline.phases", "unknown phase 'ppo'"),
    (["pipeline.phases=[]"], "pipeline.phases", "at least one phase"),
    (["pipeline.phases=[rsr1, rsr1]"], "pipeline.phases", "listed twice"),
    (["pipeline.sft_epochs=-1"], "pipeline.sft_epochs", "must be > 0"),
    (["pipeline.keep_checkpoints=0"], "pipeline.keep_checkpoints", "must be > 0"),
    (["pipeline.critic_seed_epochs=-2"], "pipeline.critic_seed_epochs", "must be > 0"),
    (["env.max_tasks=-1"], "env.max_tasks", "must be >= 0"),
    (["rollout.responses_per_task=0"], "rollout.responses_per_task", "must be > 0"),
    (["run.resume=sometimes"], "run.resume", "'auto' or 'never'"),
    (["pipeline.actor_from.rpr7=init"], "pipeline.actor_from.rpr7", "not a phase of the plan"),
    (["pipeline.phase_overrides.rpr1=3"], "pipeline.phase_overrides.rpr1", "must be a mapping"),
    (["rl.per_device_token_budget=-1"], "rl.per_device_token_budget", "must be >= 0 (0 = no packing)"),
    (["pipeline.micro_batch=-1"], "pipeline.micro_batch", "must be >= 0"),
    (["rl.per_device_token_budget=3000"], "rl.per_device_token_budget", "multiple of rl.pad_multiple=256"),
    (["rollout.max_input_tokens=0"], "rollout.max_input_tokens", "must be > 0"),
    (["sampler.decode_impl=ragged"], "sampler.decode_impl", "'paged', 'slot' or 'maxtext'"),
    (["sampler.block_size=0"], "sampler.block_size", "must be >= 1"),
    (["sampler.prefill_chunk=0"], "sampler.prefill_chunk", "must be >= 1"),
    (["sampler.kv_blocks=3"], "sampler.kv_blocks", "one sequence of max_cache_length=8192"),
    (["rsr.num_runbooks=-1"], "rsr.num_runbooks", "must be >= 0 (0: runbook stage off)"),
    (["rsr.max_tasks=-2"], "rsr.max_tasks", "must be >= 0 (0: every task)"),
    (["rsr.families=['']"], "rsr.families", "must list task families"),
    (["rsr.harnesses=[json, oracle]"], "rsr.harnesses", "distinct harnesses of ['json', 'xml']"),
    (["rsr.harnesses=[json, json]"], "rsr.harnesses", "distinct harnesses"),
    (["rsr.policy=oracle"], "rsr.policy", "must be actor/scripted"),
    (["rsr.discovery_attempts=0"], "rsr.discovery_attempts", "must be > 0"),
    (["pipeline.critic_only_steps=40"], "pipeline.critic_only_steps", "must be in [0, rollout_steps"),
    (["reward.kind=xyz"], "reward.kind", "'fdr' or 'spr'"),
    (["sampler.prefill_buckets=[64, 32]"], "sampler.prefill_buckets", "increasing"),
    (["sampler.swap_policy=drop"], "sampler.swap_policy", "finish_on_old"),
    (["env.concurrency=0"], "env.concurrency", "must be > 0"),
    (["model_name=no-such-model"], "model_name", "no model file"),
    (["model=3"], "model", "expected a mapping"),
    (["justakey"], "justakey", "expected key=value"),
])
def test_errors_name_the_key(overrides, key, msg):
  with pytest.raises(ConfigError) as e:
    load_config(SMOKE, overrides)
  assert key in str(e.value) and msg in str(e.value)


def test_file_errors(tmp_path):
  with pytest.raises(ConfigError, match="does not exist"):
    load_config(tmp_path / "nope.yml")
  bad = tmp_path / "bad.yml"
  bad.write_text("run: [unclosed")
  with pytest.raises(ConfigError, match="invalid YAML"):
    load_config(bad)
  lst = tmp_path / "list.yml"
  lst.write_text("- a\n- b\n")
  with pytest.raises(ConfigError, match="top level must be a mapping"):
    load_config(lst)
  a, b = tmp_path / "a.yml", tmp_path / "b.yml"
  a.write_text("base_config: b.yml\n")
  b.write_text("base_config: a.yml\n")
  with pytest.raises(ConfigError, match="cycle"):
    load_config(a)
  typo = tmp_path / "typo.yml"
  typo.write_text(f"base_config: {CONFIG_DIR / 'base.yml'}\nrollout:\n  global_bach: 8\n")
  with pytest.raises(ConfigError, match=r"rollout\.global_bach: unknown config key"):
    load_config(typo)


@pytest.mark.parametrize("path", sorted((CONFIG_DIR / "pod").glob("*.yml")), ids=lambda p: p.stem)
def test_pod_configs_load_and_their_mesh_fills_the_named_slice(path):
  """Each run file of configs/pod/ is a valid config whose mesh uses every chip of the TPU slice its compile
  plan command names (the README's table comes from those commands)."""
  import math
  import re
  cfg = load_config(path)
  topo = re.search(r"--topology=(\w+):([\dx]+)", path.read_text())
  assert topo, f"{path.name} names no --topology"
  chips = math.prod(int(x) for x in topo.group(2).split("x"))
  m = cfg.mesh
  used = (m.ici_data_parallelism * m.ici_fsdp_parallelism * m.ici_tensor_parallelism * m.ici_context_parallelism
          * m.dcn_data_parallelism * m.dcn_fsdp_parallelism)
  assert used == chips
  assert cfg.rollout.global_batch % (m.ici_data_parallelism * m.ici_fsdp_parallelism) == 0


@pytest.mark.parametrize("mode", ["all", "failures", "sample:1", "sample:16"])
def test_keep_transcripts_accepts_its_modes(mode):
  assert load_config(SMOKE, [f"run.keep_transcripts={mode}"]).run.keep_transcripts == mode


@pytest.mark.parametrize("mode", ["some", "sample:0", "sample:", "sample:x", "sample:-2", "ALL", ""])
def test_keep_transcripts_refuses_anything_else_naming_the_key(mode):
  with pytest.raises(ConfigError, match=r"run\.keep_transcripts: must be 'all', 'failures' or 'sample:N'"):
    load_config(SMOKE, [f"run.keep_transcripts={mode}"])


def test_pod_configs_keep_a_sample_of_transcripts():
  for f in sorted((CONFIG_DIR / "pod").glob("*.yml")):
    assert load_config(f, []).run.keep_transcripts.startswith("sample:"), f.name
