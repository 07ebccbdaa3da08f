"""What a verifier script fetches at test time, found at build time (rsi_jax.env.verifier_deps): through the
scripts of the tests folder it sources or calls, and the requirement files it names where they will be when the
tests run; the build's replay of its uv commands fails the build, naming the command, where it fails."""

import ssl
import textwrap
import urllib.request

import pytest

from rsi_jax.env.tasks import load_task
from rsi_jax.env.verifier_deps import fetches, requirements

TASK_YAML = ("instruction: Write done to /app/out.txt.\ndifficulty: easy\ncategory: deps\nparser_name: pytest\n"
             "max_agent_timeout_sec: 120.0\nmax_test_timeout_sec: 180.0\n")
# deveval's tests/setup-uv-pytest.sh and tests/run-uv-pytest.sh, verbatim
SETUP_UV_PYTEST = """#!/bin/bash

# Install curl
apt-get update
apt-get install -y curl

# Install uv
curl -LsSf https://astral.sh/uv/install.sh | sh

source $HOME/.local/bin/env

# Check if we're in a valid working directory
if [ "$PWD" = "/" ]; then
    echo "Error: No working directory set. Please set a WORKDIR in your Dockerfile before running this script."
    exit 1
fi

uv init
uv add pytest"""
RUN_UV_PYTEST = "#! /bin/bash\n\nuv run pytest $TEST_DIR/test_outputs.py -rA \n"


def _tb1(tmp_path, run_tests: str, files: dict, dockerfile: str = "FROM rsi-base\nWORKDIR /app\n"):
  """A TB1 task folder: ``files`` maps paths in the task folder to their content."""
  d = tmp_path / "task"
  (d / "tests").mkdir(parents=True)
  (d / "task.yaml").write_text(TASK_YAML)
  (d / "Dockerfile").write_text(dockerfile)
  (d / "run-tests.sh").write_text(run_tests)
  (d / "solution.sh").write_text("#!/bin/bash\necho done > /app/out.txt\n")
  for name, text in files.items():
    (d / name).parent.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(text)
  return load_task(d)


def test_fetches_follow_the_scripts_the_verifier_runs(tmp_path):
  """Every form of sourcing or calling a tests-folder script is followed, recursively, a cycle ends; a script
  outside the tests folder (or one it does not hold) is not read."""
  t = _tb1(tmp_path, "#!/bin/bash\nset -e\nsource $TEST_DIR/a.sh\n. ${TEST_DIR}/b.sh\nbash /tests/c.sh\n"
           "cd $TEST_DIR && sh ./d.sh\nbash e.sh arg\n\"$TEST_DIR\"/sub/g.sh\nsource /etc/profile\n"
           "bash $TEST_DIR/missing.sh\nbash -c 'pip install pkg-h==8'\n",
           {"tests/a.sh": "pip install pkg-a==1\nsource $TEST_DIR/f.sh\n",
            "tests/b.sh": "apt-get install -y pkg-b\n", "tests/c.sh": "uv add pkg-c==3\n",
            "tests/d.sh": "pip3 install pkg-d==4\n", "tests/e.sh": "python3 -m pip install pkg-e==5\n",
            "tests/f.sh": "uvx pkg-f==6\nsource $TEST_DIR/a.sh\n. ./f.sh\n",  # a cycle, and itself
            "tests/sub/g.sh": "uv pip install pkg-g==7\n"})
  assert fetches(t) == ["apt pkg-b", "pkg-a==1", "pkg-c==3", "pkg-d==4", "pkg-e==5", "pkg-f==6", "pkg-g==7",
                        "pkg-h==8"]


def test_requirement_files_are_found_where_the_script_reads_them(tmp_path):
  """``-r FILE`` relative to the script's working directory (the image's WORKDIR, followed through ``cd``):
  the app folder's file the Dockerfile copies from the build context (quoted COPY arguments too), the tests
  folder's, and the files a requirement file names itself."""
  t = _tb1(tmp_path, textwrap.dedent("""\
      #!/bin/bash
      cat <<'EOF_SETUP_SCRIPT' > setup_modified.sh
      #!/bin/sh
      pip install -r docs/requirements.txt
      EOF_SETUP_SCRIPT
      ./setup_modified.sh
      cd /opt/extra && pip install --requirement=extra.txt
      pip install -r $TEST_DIR/test-requirements.txt -r /nowhere/requirements.txt
      """), {"repo/docs/requirements.txt": "numpy==2.1.0  # pinned\n-r ../base.txt\n\n# comment\n",
             "repo/base.txt": "six==1.16.0\n", "extra.txt": "attrs>=23\n",
             "tests/test-requirements.txt": "pluggy==1.5.0\n"},
      dockerfile='FROM rsi-base\nWORKDIR /app\nCOPY "repo/" "/app/"\nCOPY extra.txt /opt/extra/\n')
  assert requirements(t) == ["attrs>=23", "numpy==2.1.0", "pluggy==1.5.0", "six==1.16.0"]


def _registry_reachable() -> bool:
  from rsi_jax.env.images import host_ca_bundle
  try:
    ctx = ssl.create_default_context(cafile=host_ca_bundle())
    urllib.request.urlopen("https://pypi.org/simple/uv/", timeout=15, context=ctx).close()
    return True
  except OSError:
    return False


@pytest.fixture(scope="module")
def registry():
  if not _registry_reachable():
    pytest.skip("PyPI cannot be reached from this host")


@pytest.mark.docker
@pytest.mark.network
@pytest.mark.slow
def test_deveval_shaped_task_scores_offline(tmp_path, docker_client, settings, registry):
  """deveval's shape: run-tests.sh pip-installs the app's docs/requirements.txt (from a script it writes and
  runs), then sources tests/setup-uv-pytest.sh (apt curl, the uv installer, uv init, uv add pytest) and calls
  tests/run-uv-pytest.sh (uv run pytest). The build fetches all of it; the episode, offline, scores 1."""
  from rsi_jax.env.harness import OracleHarness
  from rsi_jax.env.episode import run_episode
  t = _tb1(tmp_path, textwrap.dedent("""\
      #!/bin/bash
      set -e
      cat <<'EOF_SETUP_SCRIPT' > setup_modified.sh
      #!/bin/sh
      pip install --break-system-packages -r docs/requirements.txt
      EOF_SETUP_SCRIPT
      chmod +x setup_modified.sh
      ./setup_modified.sh
      python3 -c 'import six; print("six-version", six.__version__)'
      cd /app
      source $TEST_DIR/setup-uv-pytest.sh
      bash $TEST_DIR/run-uv-pytest.sh"""),
      {"repo/docs/requirements.txt": "six==1.16.0\n", "repo/README.md": "app\n",
       "tests/setup-uv-pytest.sh": SETUP_UV_PYTEST, "tests/run-uv-pytest.sh": RUN_UV_PYTEST,
       "tests/test_outputs.py": "def test_done():\n  assert open('/app/out.txt').read() == 'done\\n'\n"},
      dockerfile='FROM rsi-base\nWORKDIR /app\nCOPY "repo/" "/app/"\n')
  assert fetches(t) == ["apt curl", "uv (newest)", "pytest", "six==1.16.0"]
  r = run_episode(t, OracleHarness(), docker_client, settings)
  assert r.success == 1 and r.outcome.passed == r.outcome.total == 1, (r.error, r.verifier_output[-2000:])
  assert "six-version 1.16.0" in r.verifier_output and "PASSED" in r.verifier_output


@pytest.mark.docker
@pytest.mark.network
@pytest.mark.slow
def test_uv_commands_are_replayed_where_they_run(tmp_path, docker_client, settings, registry):
  """The build replays the script's uv commands in a copy of the folder each runs in (`cd /opt/proj && uv
  sync`: the project the Dockerfile copies there), so the episode's offline `uv sync` / `uv run` find its
  dependencies in the image. A command that fails there (`uv sync` with no project in the image's working
  directory) would fail offline at test time too: the build fails, naming it."""
  from rsi_jax.env.harness import OracleHarness
  from rsi_jax.env.images import build_task_image
  from rsi_jax.env.episode import run_episode
  from rsi_jax.env.sandbox import BUILD_FAILED, SandboxError
  uv = "#!/bin/bash\ncurl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh\nsource $HOME/.local/bin/env\n"
  test = "import six\n\ndef test_six():\n  assert six.__version__ == '1.16.0'\n"
  t = _tb1(tmp_path, uv + "cd /opt/proj && uv sync\nuv run pytest $TEST_DIR/test_outputs.py -rA\n",
           {"proj/pyproject.toml": '[project]\nname = "proj"\nversion = "0.1.0"\nrequires-python = ">=3.9"\n'
                                   'dependencies = ["six==1.16.0", "pytest==8.4.1"]\n',
            "tests/test_outputs.py": test},
           dockerfile="FROM rsi-base\nWORKDIR /app\nCOPY proj /opt/proj\n")
  r = run_episode(t, OracleHarness(), docker_client, settings)
  assert r.success == 1 and r.outcome.passed == 1, (r.error, r.verifier_output[-2000:])
  t = _tb1(tmp_path / "b", uv + "uv sync\nuv run pytest $TEST_DIR/test_outputs.py\n", {"tests/test_outputs.py": test})
  with pytest.raises(SandboxError) as e:
    build_task_image(docker_client, t, settings.image_map, network="host", ca_bundle=settings.build_ca_bundle)
  first = str(e.value).splitlines()[0]
  assert e.value.kind == BUILD_FAILED
  assert "for what the verifier script fetches" in first and "command `uv sync` failed at build time" in first, first


@pytest.mark.docker
def test_verifier_installs_read_no_configuration_file_of_the_agents(docker_client):
  """pip's configuration files are writable by the agent (``/etc/pip.conf``, ``~/.config/pip``): with the
  verifier's install variables pip reads none of them (uv likewise: UV_NO_CONFIG)."""
  from rsi_jax.env.verifier_deps import OFFLINE_ENV
  script = ("printf '[global]\\ntimeout = 7\\n[install]\\npre = true\\n' > /etc/pip.conf; "
            "python3 -m pip config list 2>&1")
  out = docker_client.containers.run("rsi-base", ["/bin/bash", "-c", script], environment=OFFLINE_ENV,
                                     network_mode="none", remove=True).decode()
  assert "timeout" not in out and "pre" not in out, out
  assert OFFLINE_ENV["UV_NO_CONFIG"] == "1"
