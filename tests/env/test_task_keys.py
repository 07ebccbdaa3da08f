"""Task keys that change how an episode runs: environment.storage (a container writing beyond it is stopped
with the reason), environment.allow_internet (refused without a network, never scored 0), [verifier.env]."""

import json
import shutil

import pytest

from rsi_jax.env.harness import JsonHarness, OracleHarness, ScriptedPolicy
from rsi_jax.env.episode import NEEDS_INTERNET, run_episode
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
  from rsi_jax.env.images import build_task_image, prune_task_images
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


@pytest.mark.docker
def test_tb1_dockerfile_may_copy_private_files_the_agent_never_sees(tmp_path, docker_client, settings, tokenizer,
                                                                     renderer):
  """Upstream TB1 Dockerfiles COPY tests/ or solution.sh: they are in the build context, and deleted from the
  container before the agent starts."""
  d = tmp_path / "tb1-copies"
  shutil.copytree(FIXTURES / "tb1-word-sum", d)
  (d / "Dockerfile").write_text((d / "Dockerfile").read_text() + "COPY tests/ /opt/t/\nCOPY solution.sh ./\n")
  task = load_task(d)
  assert "tests" not in task.context_exclude and "solution.sh" not in task.context_exclude
  assert task.private_in_image == ("/app/solution.sh", "/opt/t/test_outputs.py")
  probe = "ls /opt/t /app/solution.sh 2>&1; ls /app"
  policy = ScriptedPolicy(tokenizer, [json.dumps({"command": probe})])
  r = run_episode(task, JsonHarness(policy, renderer, SamplingParams(max_new_tokens=256), max_turns=2,
                                    command_timeout_s=20), docker_client, settings)
  out = json.loads(r.turns[0].observation)["output"]
  assert "test_outputs.py" not in out and "No such file" in out and "numbers.txt" in out, out
  assert run_episode(task, OracleHarness(), docker_client, settings).success == 1


def test_tb1_parser_other_than_pytest_is_refused(tmp_path):
  d = tmp_path / "tb1-parser"
  shutil.copytree(FIXTURES / "tb1-word-sum", d)
  (d / "task.yaml").write_text((d / "task.yaml").read_text().replace("parser_name: pytest", "parser_name: swebench"))
  with pytest.raises(TaskError, match="parser_name.*only 'pytest'"):
    load_task(d)


def test_build_ca_bundle_reaches_every_build_stage(tmp_path):
  from rsi_jax.env.images import CA_IN_CONTEXT, CA_IN_IMAGE, with_build_ca
  text = with_build_ca("FROM rsi-base AS a\nRUN pip download six\nFROM a\nRUN true\n", "ab" * 32)
  lines = text.splitlines()
  assert lines[0] == "# rsi_jax: build CA bundle sha256:" + "ab" * 32
  assert lines.count(f"COPY {CA_IN_CONTEXT} {CA_IN_IMAGE}") == 2
  assert f"ARG PIP_CERT={CA_IN_IMAGE}" in lines and f"ARG SSL_CERT_FILE={CA_IN_IMAGE}" in lines
  assert lines.index("RUN pip download six") > lines.index(f"ARG PIP_CERT={CA_IN_IMAGE}")


@pytest.mark.docker
@pytest.mark.network
def test_build_reaches_the_package_registry(tmp_path, docker_client, settings):
  """A Dockerfile that pip-installs at build time builds with env.build_network=host through the host's CA
  bundle (behind a TLS-inspecting proxy the build fails without it)."""
  from rsi_jax.env.images import build_task_image, host_ca_bundle
  d = _copy(tmp_path)
  (d / "environment" / "Dockerfile").write_text(
      "FROM rsi-base\nWORKDIR /app\nCOPY input.txt /app/input.txt\n"
      "RUN pip install --no-cache-dir --break-system-packages --target /opt/six six==1.16.0\n")
  tag = build_task_image(docker_client, load_task(d), settings.image_map, network="host", ca_bundle=host_ca_bundle())
  out = docker_client.containers.run(tag, ["python3", "-c", "import sys; sys.path.insert(0, '/opt/six'); "
                                           "import six; print(six.__version__)"], remove=True, network_mode="none")
  assert out.decode().strip() == "1.16.0"
  docker_client.images.remove(tag)


def test_verifier_requirements_are_read_from_the_script(tmp_path):
  from rsi_jax.env.verifier_deps import requirements
  d = _copy(tmp_path)
  (d / "tests" / "requirements.txt").write_text("numpy==2.1.0  # pinned\nrequests>=2\n\n")
  (d / "tests" / "test.sh").write_text(
      "#!/bin/bash\n# uvx -w commented==1.0 out\napt-get update && apt-get install -y curl\n"
      "pip install --break-system-packages pytest==8.2.0 'six==1.16.0' -r /tests/requirements.txt\n"
      "python3 -m pip install -q --index-url https://x/simple attrs\n"
      "uv pip install --system pluggy==1.5.0\n"
      "uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest --ctrf /logs/verifier/ctrf.json\n"
      "uv run --with iniconfig==2.0.0 pytest\n")
  assert requirements(load_task(d)) == ["attrs", "iniconfig==2.0.0", "numpy==2.1.0", "pluggy==1.5.0",
                                        "pytest", "pytest-json-ctrf==0.3.5", "pytest==8.2.0", "pytest==8.4.1",
                                        "requests>=2", "six==1.16.0"]


def test_verifier_fetches_are_turned_into_build_steps(tmp_path):
  """The TB1 boilerplate (apt-get curl, the uv installer, uv init / add / run) and TB2's (uvx -p 3.13 -w ...)
  become build steps: apt packages, the wheels, uv at the installer's version, a python request, and the uv
  commands replayed with the tools' own arguments replaced (nothing of the tests runs at build time); a
  task's last USER is restored after them."""
  from rsi_jax.env.verifier_deps import (_uv_commands, apt_packages, build_steps, python_requests,
                                         uv_installer)
  d = _copy(tmp_path)
  (d / "tests" / "test.sh").write_text(
      "#!/bin/bash\napt-get update\napt-get install -y curl git=1:2.39.5-0+deb12u2\n"
      "curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh\nsource $HOME/.local/bin/env\n"
      "uv init\nuv add pytest==8.4.1\nuv run pytest $TEST_DIR/test_outputs.py -rA\n"
      "uvx \\\n  -p 3.13 \\\n  -w pytest-json-ctrf==0.3.5 \\\n  pytest --ctrf /logs/verifier/ctrf.json /tests/x.py\n")
  t = load_task(d)
  assert apt_packages(t) == ["curl", "git=1:2.39.5-0+deb12u2"]
  assert uv_installer(t) == "0.7.13"
  assert python_requests(t) == ["3.13"]
  assert _uv_commands(t) == [["uv", "init"], ["uv", "add", "pytest==8.4.1"], ["uv", "run", "python", "--version"],
                             ["uvx", "-p", "3.13", "-w", "pytest-json-ctrf==0.3.5", "pytest", "--version"]]
  steps = build_steps(t, "FROM rsi-base\nUSER app\n").splitlines()
  assert steps[1] == "USER root" and steps[-1] == "USER app"
  assert steps[2] == ("RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
                      "--no-install-recommends curl git=1:2.39.5-0+deb12u2")
  assert "pytest-json-ctrf==0.3.5 pytest==8.4.1" in steps[3] and "uv==0.7.13" in steps[4]
  assert "uv python find 3.13" in steps[5] and "uv python install 3.13" in steps[5]
  assert all(f"{{ {c}" in steps[6] for c in ("uv add pytest==8.4.1 ||", "uv run python --version ||", "uvx -p 3.13"))
  assert "/tests/x.py" not in "\n".join(steps) and "ctrf.json" not in "\n".join(steps)
  (d / "tests" / "test.sh").write_text("#!/bin/bash\n# curl https://astral.sh/uv/install.sh is not run here\n"
                                       "python3 -m pytest /tests\n")
  t = load_task(d)
  assert build_steps(t, "FROM rsi-base\n") == "" and uv_installer(t) is None


@pytest.mark.docker
@pytest.mark.network
def test_verifier_installs_offline_what_the_build_fetched(tmp_path, docker_client, settings):
  """An unmodified verifier script that pip-installs at test time: with a network build the package is
  fetched into the image and the same command installs it with the network off (S = 1); with builds offline
  the task is refused as an infrastructure failure naming what it fetches (not a silent 0)."""
  import dataclasses

  from rsi_jax.env.images import host_ca_bundle
  d = _copy(tmp_path)
  script = (d / "tests" / "test.sh").read_text()
  (d / "tests" / "test.sh").write_text(script.replace(
      "mkdir -p /logs/verifier\n",
      "mkdir -p /logs/verifier\npip install --break-system-packages --quiet six==1.16.0 || exit 1\n", 1))
  (d / "tests" / "test_outputs.py").write_text((d / "tests" / "test_outputs.py").read_text()
                                               + "\n\ndef test_six():\n  import six\n  assert six.__version__ == '1.16.0'\n")
  task = load_task(d)
  online = dataclasses.replace(settings, build_network="host", build_ca_bundle=host_ca_bundle())
  ok = run_episode(task, OracleHarness(), docker_client, online)
  assert ok.success == 1 and ok.outcome.passed == 4, ok.verifier_output[-1500:]
  offline = run_episode(task, OracleHarness(), docker_client, dataclasses.replace(settings, build_network="none"))
  assert offline.infra_failure and offline.failure_kind == "needs_build_network"
  assert "six==1.16.0" in offline.error and "env.build_network: host" in offline.error
