"""The learning check's generated suite (rsi_jax.env.learn_tasks): splits that share no combination, real
Harbor folders the loader reads, and in the sandbox the oracle solves every task of both splits while an agent
that does nothing solves none."""

import json

import pytest

from rsi_jax.env.learn_tasks import BY_NAME, TEMPLATES, make_suite, split
from rsi_jax.env.tasks import LAYOUT_HARBOR, load_tasks


def test_splits_share_no_combination_and_cover_every_template():
  parts = split(seed=3, train_per_template=8, heldout_per_template=4)
  train = {(t.name, p) for t, p in parts["train"]}
  held = {(t.name, p) for t, p in parts["heldout"]}
  assert len(train) == 8 * len(TEMPLATES) and len(held) == 4 * len(TEMPLATES) and not train & held
  assert {t for t, _ in held} == set(BY_NAME)
  # the instruction names every parameter: no held-out instruction occurs in training
  instr = lambda items: {BY_NAME[t].instruction(*p) for t, p in items}  # noqa: E731
  assert not instr(train) & instr(held)
  assert split(seed=3, train_per_template=8, heldout_per_template=4)["heldout"] == parts["heldout"]
  assert split(seed=4, train_per_template=8, heldout_per_template=4)["heldout"] != parts["heldout"]
  with pytest.raises(ValueError, match="fewer than"):
    split(seed=0, train_per_template=100, heldout_per_template=4)


def test_base_split_is_disjoint_from_train_and_heldout_and_leaves_them_unchanged():
  parts = split(seed=3, train_per_template=24, heldout_per_template=4, base_per_template=24)
  keys = {k: {(t.name, p) for t, p in v} for k, v in parts.items()}
  assert sorted(keys) == ["base", "heldout", "train"]
  assert len(keys["base"]) == 24 * len(TEMPLATES)
  assert not keys["base"] & keys["train"] and not keys["base"] & keys["heldout"]
  without = split(seed=3, train_per_template=24, heldout_per_template=4)
  assert "base" not in without
  assert (without["train"], without["heldout"]) == (parts["train"], parts["heldout"])
  with pytest.raises(ValueError, match=r"fewer than 4 held-out \+ 24 train \+ 29 base"):
    split(seed=0, train_per_template=24, heldout_per_template=4, base_per_template=29)  # 57 > 56 combinations


def test_suite_folders_load(tmp_path):
  paths = make_suite(tmp_path, seed=1, train_per_template=2, heldout_per_template=1)
  train, held = load_tasks(paths["train"]), load_tasks(paths["heldout"])
  assert len(train) == 2 * len(TEMPLATES) and len(held) == len(TEMPLATES)
  assert all(t.layout == LAYOUT_HARBOR and t.family in BY_NAME for t in train + held)
  meta = json.loads((tmp_path / "suite.json").read_text())
  assert sorted(meta["heldout"]) == sorted(t.name for t in held)
  with pytest.raises(ValueError, match="unknown template"):
    make_suite(tmp_path, templates=["nope"])


@pytest.mark.docker
@pytest.mark.slow
def test_oracle_solves_both_splits_and_doing_nothing_solves_none(tmp_path, docker_client, settings, tokenizer,
                                                                  renderer):
  from rsi_jax.env.harness import JsonHarness, OracleHarness, ScriptedPolicy
  from rsi_jax.env.pool import EnvPool
  from rsi_jax.policy import SamplingParams
  paths = make_suite(tmp_path, seed=0, train_per_template=2, heldout_per_template=2)
  tasks = load_tasks(paths["train"]) + load_tasks(paths["heldout"])
  nothing = lambda: JsonHarness(ScriptedPolicy(tokenizer, ['{"done": true}']), renderer,  # noqa: E731
                                SamplingParams(), max_turns=1)
  with EnvPool(settings, concurrency=4) as pool:
    oracle = pool.run([(t, OracleHarness()) for t in tasks])
    idle = pool.run([(t, nothing) for t in tasks])
  assert [(r.task, r.outcome.reason) for r in oracle if r.success != 1] == []
  assert [r.task for r in idle if r.success != 0 or r.infra_failure] == []
