"""The env config section drives the episode settings and the harness (no Docker needed)."""

import pytest

from rsi_jax.config import ConfigError, load_config
from rsi_jax.env.harness import JsonHarness, OracleHarness, ScriptedPolicy, XmlHarness, make_harness
from rsi_jax.env.episode import EnvSettings
from rsi_jax.policy import SamplingParams

from .conftest import REPO

SMOKE = REPO / "configs" / "smoke.yml"


def test_settings_from_config():
  cfg = load_config(SMOKE, ["env.image_map={node:*: my-base}", "env.pids_limit=64"])
  s = EnvSettings.from_config(cfg.env, "run-1", hygiene_patterns=cfg.reward.hygiene_patterns)
  assert s.run_id == "run-1" and s.network == "none" and s.build_network == "host" and s.pids_limit == 64
  assert s.command_timeout_s == cfg.env.command_timeout_s and s.verifier_timeout_s == cfg.env.verifier_timeout_s
  # the configured entries come first, then the built-in upstream patterns -> the family (else env.base_image)
  assert list(s.image_map.items())[0] == ("node:*", "my-base")
  assert s.image_map["ubuntu:*"] == ("rsi-base-jammy", "rsi-base") and s.image_map["debian:*"] == "rsi-base"


def test_make_harness_from_config(tokenizer, renderer):
  cfg = load_config(SMOKE, ["env.max_turns=5", "env.summarize_threshold_tokens=999"])
  pol = ScriptedPolicy(tokenizer, [])
  h = make_harness(cfg.env.harness, pol, renderer, SamplingParams(), cfg.env)
  assert isinstance(h, JsonHarness) and h.max_turns == 5 and h.summarize_threshold_tokens == 999
  assert isinstance(make_harness("xml", pol, renderer), XmlHarness)
  assert isinstance(make_harness("oracle"), OracleHarness)
  with pytest.raises(ValueError, match="needs a policy"):
    make_harness("json")


def test_summarization_threshold_fits_the_policys_prompt_limit(tokenizer, renderer):
  """With a sampler that rejects prompts over its prefill limit, the configured threshold (32,000 tokens)
  could never trigger: the harness lowers it to leave room for the summary request."""
  cfg = load_config(SMOKE, ["env.summarize_threshold_tokens=32000"])
  pol = ScriptedPolicy(tokenizer, [])
  pol.max_prompt_tokens = 1024
  h = make_harness("json", pol, renderer, SamplingParams(), cfg.env)
  assert cfg.env.summarize_threshold_tokens == 32_000 and h.summarize_threshold_tokens == 1024 - 256
  pol.max_prompt_tokens = 100_000
  assert make_harness("json", pol, renderer, SamplingParams(), cfg.env).summarize_threshold_tokens == 32_000


@pytest.mark.parametrize("override, key", [("env.network=bridge2", "env.network"),
                                           ("env.build_network=wifi", "env.build_network"),
                                           ("env.harness=yaml", "env.harness"),
                                           ("env.pids_limit=0", "env.pids_limit")])
def test_bad_env_values(override, key):
  with pytest.raises(ConfigError, match=key):
    load_config(SMOKE, [override])
