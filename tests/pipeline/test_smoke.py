"""The phase plan end to end at the smallest size: real MaxText models on an 8-device mesh, the sampler,
Docker tasks with protected verification, Orbax checkpoints and the lineage record."""

import json

import jax
import pytest

from rsi_jax.config import CONFIG_DIR, load_config
from rsi_jax.models import Actor, Critic, build_mesh
from rsi_jax.models.checkpoint import restore_params, saved_items

pytestmark = [pytest.mark.slow, pytest.mark.docker]


@pytest.fixture(scope="module")
def run(tmp_path_factory, docker_client):
  from rsi_jax.pipeline.smoke import run_smoke
  out = tmp_path_factory.mktemp("smoke")
  cfg = load_config(CONFIG_DIR / "smoke.yml", [
      f"run.output_dir={out}", "run.name=t", "run.progress=false",
      "mesh.ici_fsdp_parallelism=4", "mesh.ici_tensor_parallelism=2",
      "rollout.global_batch=4", "rollout.requested=4", "rollout.max_new_tokens=16",
      "env.max_turns=1", "pipeline.phases=[rsr1, critic_seed, rpr1, rsr2]", "pipeline.sft_epochs=2",
      "pipeline.rollout_steps=2", "pipeline.critic_only_steps=1"])
  summary = run_smoke(cfg)
  return cfg, summary, out / "t"


def test_every_check_holds(run):
  _, summary, _ = run
  assert summary.ok, summary.render()
  text = summary.render()
  for key in ("sharded forward", "container round trip", "rsr1", "critic_seed", "rpr1", "rsr2 critic carried"):
    assert key in text


def test_no_container_left(run, docker_client):
  from rsi_jax.env.sandbox import LABEL_RUN
  _, summary, _ = run
  assert summary.run_id
  assert not docker_client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={summary.run_id}"})


def test_lineage_chains_phases_and_carries_the_critic(run):
  _, _, run_dir = run
  lineage = json.loads((run_dir / "lineage.json").read_text())
  assert [e["phase"] for e in lineage] == ["rsr1", "critic_seed", "rpr1", "rsr2"]
  # each phase starts from the previous phase's output
  for before, after in zip(lineage, lineage[1:]):
    assert after["started_from"]["actor"] == before["output"]
  assert lineage[0]["started_from"]["actor"] == "init(seed=0)" and lineage[0]["critic_digest"] is None
  # critic seed: actor frozen; RSR-2: critic carried unchanged (Δφ = 0), actor changed
  assert lineage[1]["actor_digest"] == lineage[0]["actor_digest"]
  assert lineage[3]["critic_digest"] == lineage[2]["critic_digest"]
  assert lineage[3]["actor_digest"] != lineage[2]["actor_digest"]
  rpr = lineage[2]
  assert [s["train_actor"] for s in rpr["steps"]] == [False, True]
  assert rpr["reward"] == "fdr" and rpr["actor_lr"] == 5e-7  # the rpr1 phase overlay applied
  assert lineage[0]["sft_losses"][-1] < lineage[0]["sft_losses"][0]


def test_checkpoints_restore_onto_the_mesh(run):
  cfg, _, run_dir = run
  lineage = json.loads((run_dir / "lineage.json").read_text())
  final = lineage[-1]["output"]
  assert saved_items(final) == ("actor", "critic")
  assert saved_items(lineage[0]["output"]) == ("actor",)  # no critic exists before the critic seed
  mesh = build_mesh(cfg)
  actor, critic = Actor(cfg, mesh), Critic(cfg, mesh)
  got = restore_params(final, actor=actor.abstract_params, critic=critic.abstract_params)
  from rsi_jax.pipeline.smoke import params_digest
  assert params_digest(got["critic"]) == lineage[-1]["critic_digest"]
  assert params_digest(got["actor"]) == lineage[-1]["actor_digest"]
  leaf = jax.tree.leaves(got["actor"])[0]
  assert leaf.sharding.mesh.shape == mesh.shape
