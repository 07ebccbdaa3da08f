"""Task keys that change how an episode runs: environment.storage (a container writing beyond it is stopped
with the reason), environment.allow_internet (refused without a network, never scored 0), [verifier.env]."""

import json
import shutil

import pytest

from rsi_jax.env.harness import JsonHarness, OracleHarness, ScriptedPolicy
from rsi_jax.env.pool import NEEDS_INTERNET, run_episode
from rsi_jax.env.sandbox import DISK_LIMIT
from rsi_jax.env.tasks import TaskError, load_task
from rsi_jax.policy import SamplingParams

from .conftest import FIXTURES


def _copy(tmp_path, toml_extra: str = "", name="harbor-greeting"):
  d = tmp_path / name
  shutil.copytree(FIXTURES / name, d)
  if toml_extra:
    text = (d / "task.toml").read_text()
    for section, lines in toml_extra.items():
      text = text.replace(f"[{section}]\n", f"[{section}]\n{lines}\n")
    (d / "task.toml").write_text(text)
  return d


def test_keys_are_read_and_checked(tmp_path):
  d = _copy(tmp_path, {"environment": 'allow_internet = true', "verifier": ""})
  (d / "task.toml").write_text((d / "task.toml").read_text() + '\n[verifier.env]\nMODE = "strict"\nLEVEL = 3\n')
  t = load_task(d)
  assert t.allow_internet is True and t.storage_bytes == 1 << 30 and t.verifier_env == {"MODE": "strict",
                                                                                      "LEVEL": "3"}
  bad = _copy(tmp_path / "b", {"environment": 'allow_internet = "yes"'})
  with pytest.raises(TaskError, match="environment.allow_internet"):
    load_task(bad)


@pytest.mark.docker
def test_writing_beyond_storage_stops_the_container(tmp_path, docker_client, settings, tokenizer, renderer):
  d = _copy(tmp_path)
  (d / "task.toml").write_text((d / "task.toml").read_text().replace('storage = "1G"', 'storage = "20M"'))
  task = load_task(d)
  cmds = ["head -c 5M /dev/zero > /app/small && echo ok", "head -c 40M /dev/zero > /app/big && echo written"]
  policy = ScriptedPolicy(tokenizer, [json.dumps({"command": c}) for c in cmds])
  r = run_episode(task, JsonHarness(policy, renderer, SamplingParams(max_new_tokens=256), max_turns=4,
                                    command_timeout_s=20), docker_client, settings)
  assert r.infra_failure and r.failure_kind == DISK_LIMIT and r.success is None
  assert "over its storage limit of 20 MiB" in r.error and "wrote 4" in r.error  # about 45 MiB
  ok = run_episode(task, OracleHarness(), docker_client, settings)  # the limit leaves normal work alone
  assert ok.success == 1


@pytest.mark.docker
def test_a_task_that_needs_the_internet_is_refused(tmp_path, docker_client, settings):
  task = load_task(_copy(tmp_path, {"environment": "allow_internet = true"}))
  r = run_episode(task, OracleHarness(), docker_client, settings)
  assert r.infra_failure and r.failure_kind == NEEDS_INTERNET and r.success is None
  assert "allow_internet" in r.error and r.build_s == 0.0


@pytest.mark.docker
def test_verifier_env_reaches_the_test_script(tmp_path, docker_client, settings):
  d = _copy(tmp_path)
  (d / "task.toml").write_text((d / "task.toml").read_text() + '\n[verifier.env]\nGREETING_REQUIRED = "yes"\n')
  script = (d / "tests" / "test.sh").read_text()
  (d / "tests" / "test.sh").write_text(script.replace("if [ $? -eq 0 ]", 'if [ $? -eq 0 ] && [ "$GREETING_REQUIRED" = yes ]'))
  r = run_episode(load_task(d), OracleHarness(), docker_client, settings)
  assert r.success == 1, r.verifier_output
  (d / "task.toml").write_text((d / "task.toml").read_text().replace('"yes"', '"no"'))
  assert run_episode(load_task(d), OracleHarness(), docker_client, settings).success == 0


@pytest.mark.docker
def test_prune_keeps_the_newest_image_of_each_task(tmp_path, docker_client):
  """Two versions of one task's image: pruning removes the older one only, and never one in use."""
  from rsi_jax.env.sandbox import build_task_image, prune_task_images
  d = _copy(tmp_path, name="harbor-calc")
  d2 = d.rename(tmp_path / "prune-probe")
  old = build_task_image(docker_client, load_task(d2))
  (d2 / "environment" / "extra.txt").write_text("a new version\n")
  (d2 / "environment" / "Dockerfile").write_text("FROM rsi-base\nWORKDIR /app\nCOPY extra.txt /app/\n")
  new = build_task_image(docker_client, load_task(d2))
  assert old != new
  removed = prune_task_images(docker_client)
  assert old in removed and new not in removed
  tags = {t for i in docker_client.images.list() for t in i.tags}
  assert new in tags and old not in tags
  docker_client.images.remove(new)
