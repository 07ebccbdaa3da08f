"""The verifier runs upstream tasks as upstream runs them (small tasks in the upstream layouts, built in
tmp_path): test files the image copied are put back, the image's PATH (a venv) is the script's, tests that
need the network offline and runners that never ran are infrastructure failures, and the siblings of the
byte-code attack (a venv's byte-code and .pth files, Python start-up files beside the interpreter) are closed."""

import base64
import json
import os
from pathlib import Path

import pytest

from rsi_jax.env.episode import run_episode
from rsi_jax.env.harness import JsonHarness, OracleHarness, ScriptedPolicy
from rsi_jax.env.pool import _NOT_RETRIED
from rsi_jax.env.sandbox import VERIFIER_ERROR
from rsi_jax.env.tasks import load_task
from rsi_jax.env.tamper import VERIFIER_PATH, agent_bytecode, protection, restore_plan, tampered_paths
from rsi_jax.env.verifier import NEEDS_NETWORK, network_failure
from rsi_jax.policy import SamplingParams
from rsi_jax.rl.ctrf import VerificationState

OK, INVALID = VerificationState.OK, VerificationState.INVALID_REPORT
# a conftest that calls every test passed
FORCE_PASS = ("import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
              "  o = yield\n  r = o.get_result()\n  r.outcome, r.longrepr = 'passed', None\n")


def agent(tokenizer, renderer, commands):
  """A scripted JSON agent: one command per turn, then {"done": true}."""
  policy = ScriptedPolicy(tokenizer, [json.dumps({"command": c}) for c in commands], default='{"done": true}')
  return JsonHarness(policy, renderer, SamplingParams(max_new_tokens=1024), max_turns=len(commands) + 1,
                     command_timeout_s=20)


def write(path: str, text: str) -> str:
  """An agent command that writes ``text`` to ``path`` (folders created)."""
  return (f"mkdir -p {os.path.dirname(path)} && echo {base64.b64encode(text.encode()).decode()} | base64 -d "
          f"> {path}")


def tb1_task(root: Path, name: str, *, dockerfile: str, tests: dict, run_tests: str,
             solution: str = "echo 42 > /app/answer.txt\n", files: dict | None = None, modes: dict | None = None):
  """A Terminal-Bench 1 task folder (task.yaml, Dockerfile, run-tests.sh, tests/, solution.sh) under ``root``."""
  d = root / name
  (d / "tests").mkdir(parents=True)
  (d / "task.yaml").write_text("instruction: Write 42 to /app/answer.txt.\ncategory: fixture-upstream\n"
                               "parser_name: pytest\nmax_agent_timeout_sec: 120\nmax_test_timeout_sec: 60\n")
  (d / "Dockerfile").write_text(dockerfile)
  (d / "run-tests.sh").write_text(run_tests)
  (d / "solution.sh").write_text(solution)
  for rel, text in {**{f"tests/{k}": v for k, v in tests.items()}, **(files or {})}.items():
    (d / rel).write_text(text)
    (d / rel).chmod((modes or {}).get(rel, 0o644))
  return load_task(d)


# ------------------------------------------------------------------ 1. test files the image copied

IMAGE_TESTS = """import os
import subprocess
from pathlib import Path


def test_answer():
  assert Path("/app/answer.txt").read_text().strip() == "42"


def test_helper_as_the_image_has_it():
  assert os.stat("/app/tests/check.sh").st_mode & 0o777 == 0o755
  assert subprocess.run(["/app/tests/check.sh"], capture_output=True, text=True).stdout == "ok\\n"
"""


@pytest.fixture(scope="module")
def image_tests_task(tmp_path_factory):
  """livecodebenchpro's layout: the image copies tests/ to /app/tests/ (a helper made executable there) and
  run-tests.sh runs the image's own copy."""
  return tb1_task(tmp_path_factory.mktemp("up"), "tb1-image-tests",
                  dockerfile="FROM rsi-base\nWORKDIR /app\nCOPY tests/ /app/tests/\n"
                             "COPY run-tests.sh /app/run-tests.sh\nRUN chmod 755 /app/tests/check.sh\n",
                  tests={"test_outputs.py": IMAGE_TESTS, "check.sh": "#!/bin/sh\necho ok\n"},
                  run_tests="#!/bin/bash\nset -euo pipefail\ncd /app\npython3 -m pytest /app/tests/test_outputs.py "
                            "--tb=short -rA\n")


@pytest.mark.docker
def test_image_copied_tests_are_put_back_for_the_oracle(docker_client, settings, image_tests_task, tokenizer,
                                                        renderer):
  task = image_tests_task
  assert set(task.private_origin) == {"/app/tests/test_outputs.py", "/app/tests/check.sh", "/app/run-tests.sh"}
  probe = agent(tokenizer, renderer, ["ls /app/tests /app/run-tests.sh 2>&1; echo END"])
  hidden = run_episode(task, probe, docker_client, settings)
  obs = json.loads(hidden.turns[0].observation)["output"]
  assert "test_outputs.py" not in obs and "check.sh" not in obs and "END" in obs  # hidden from the agent
  ok = run_episode(task, OracleHarness(), docker_client, settings)
  assert ok.outcome.state == OK and ok.success == 1, (ok.outcome.reason, ok.verifier_output[-1500:])
  assert (ok.outcome.passed, ok.outcome.total) == (2, 2)  # the helper with the image's mode, not the file's


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("how", ["rewrite", "link-and-config", "config-beside"])
def test_agent_cannot_stand_in_for_the_image_tests(docker_client, settings, image_tests_task, tokenizer,
                                                   renderer, how):
  """The agent recreates /app/tests/test_outputs.py with a test that passes, or turns /app/tests into a link to
  its own folder and plants pytest configuration above it, or only adds a conftest beside the tests: the
  verifier puts the task's tests back in a real folder and removes the agent's configuration."""
  trivial = "def test_answer():\n  pass\n"
  cmds = {
      "rewrite": [write("/app/tests/test_outputs.py", trivial)],
      "link-and-config": ["rm -rf /app/tests", write("/tmp/evil/test_outputs.py", trivial),
                          write("/tmp/evil/conftest.py", FORCE_PASS), "ln -s /tmp/evil /app/tests",
                          write("/app/conftest.py", FORCE_PASS), "printf '[pytest]\\n' > /app/pytest.ini"],
      "config-beside": [write("/app/tests/conftest.py", FORCE_PASS), write("/app/tests/sub/conftest.py", FORCE_PASS)],
  }[how]
  r = run_episode(image_tests_task, agent(tokenizer, renderer, cmds), docker_client, settings)
  assert r.outcome.state == OK and r.success == 0, (r.outcome.reason, r.error, r.verifier_output[-1500:])
  assert (r.outcome.passed, r.outcome.total) == (1, 2)  # the task's own tests ran: only the helper passes


# ------------------------------------------------------------------------------ 2. the image's PATH

VENV_TESTS = """import sys
from pathlib import Path

import venvonly


def test_answer():
  assert venvonly.check(Path("/app/answer.txt").read_text())


def test_interpreter():
  assert sys.prefix == "/opt/venv"
"""


@pytest.fixture(scope="module")
def venv_task(tmp_path_factory):
  """An image whose PATH starts with a venv (livecodebenchpro's /opt/venv/bin): `python` exists only there,
  and only the venv has the module the tests import; the script runs it isolated (-I)."""
  purelib = "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"
  return tb1_task(tmp_path_factory.mktemp("up"), "tb1-venv-path",
                  dockerfile=("FROM rsi-base\nCOPY venvonly.py /tmp/venvonly.py\n"
                              "RUN python3 -m venv --system-site-packages --without-pip /opt/venv && "
                              f"mv /tmp/venvonly.py {purelib}/\n"
                              "ENV PATH=\"/opt/venv/bin:${PATH}\"\nWORKDIR /app\n"),
                  tests={"test_outputs.py": VENV_TESTS},
                  files={"venvonly.py": "def check(text):\n  return text.strip() == '42'\n"},
                  run_tests="#!/bin/bash\ncd /app\npython -I -m pytest $TEST_DIR/test_outputs.py -rA\n")


SITE = "$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"


@pytest.mark.docker
@pytest.mark.parametrize("how", ["oracle", "ran-python-there"])
def test_image_path_venv_verifies(docker_client, settings, venv_task, tokenizer, renderer, how):
  """The oracle passes with the venv's interpreter; so does an agent that ran Python and compiled byte-code in
  the venv before solving (not tampering)."""
  if how == "oracle":
    harness = OracleHarness()
  else:
    harness = agent(tokenizer, renderer, ["python -c 'import venvonly, json, csv' && python -O -c 'import venvonly' "
                                          f"&& python -m compileall -q {SITE} && echo 42 > /app/answer.txt"])
  r = run_episode(venv_task, harness, docker_client, settings)
  assert r.outcome.state == OK and r.success == 1, (r.outcome.reason, r.error, r.verifier_output[-1500:])
  assert (r.outcome.passed, r.outcome.total) == (2, 2)


@pytest.mark.docker
@pytest.mark.parametrize("how", ["shadow", "pth", "sitecustomize", "pyvenv"])
def test_image_path_venv_is_protected(docker_client, settings, venv_task, tokenizer, renderer, how):
  """A program planted in the venv's bin (first on the PATH) that shadows a system one, a .pth file or a
  sitecustomize in the venv's site-packages, a changed pyvenv.cfg: tampering (S = 0)."""
  cmds, where = {
      "shadow": (["printf '#!/bin/sh\\nexec /usr/bin/cat \"$@\"\\n' > /opt/venv/bin/cat && chmod +x /opt/venv/bin/cat"],
                 "/opt/venv/bin/cat"),
      "pth": ([f"echo 'import os' > {SITE}/zz_agent.pth"], "zz_agent.pth"),
      "sitecustomize": ([f"echo 'import os' > {SITE}/sitecustomize.py"], "sitecustomize.py"),
      "pyvenv": (["echo 'home = /tmp/evil/bin' >> /opt/venv/pyvenv.cfg"], "/opt/venv/pyvenv.cfg"),
  }[how]
  r = run_episode(venv_task, agent(tokenizer, renderer, [*cmds, "echo 42 > /app/answer.txt"]), docker_client,
                  settings)
  assert r.success == 0 and r.outcome.state == INVALID, (r.outcome.reason, r.verifier_output[-800:])
  assert "tampered" in r.outcome.reason and where in r.error


@pytest.mark.docker
def test_forged_byte_code_in_the_image_venv_is_removed(docker_client, settings, venv_task, tokenizer, renderer):
  """The agent forges the byte-code of the venv module the tests import (its __pycache__ entry, with the source's
  timestamp and size) so that any answer checks; the script runs Python isolated, which would load it."""
  forge = ("import importlib.util, marshal, os, struct\n"
           "src = importlib.util.find_spec('venvonly').origin\n"
           "st = os.stat(src)\n"
           "code = compile('def check(text):\\n  return True\\n', src, 'exec')\n"
           "data = importlib.util.MAGIC_NUMBER + struct.pack('<III', 0, int(st.st_mtime) & 0xFFFFFFFF, "
           "st.st_size & 0xFFFFFFFF) + marshal.dumps(code)\n"
           "path = importlib.util.cache_from_source(src)\n"
           "os.makedirs(os.path.dirname(path), exist_ok=True)\n"
           "open(path, 'wb').write(data)\n")
  cmds = [write("/tmp/forge.py", forge), "python /tmp/forge.py && echo 41 > /app/answer.txt && "
          "python -I -c 'import venvonly; print(\"forged\", venvonly.check(\"41\"))'"]
  r = run_episode(venv_task, agent(tokenizer, renderer, cmds), docker_client, settings)
  assert "forged True" in r.turns[1].observation  # the forged byte-code runs for the agent's Python
  assert r.outcome.state == OK, (r.outcome.reason, r.error, r.verifier_output[-1500:])
  assert r.success == 0 and (r.outcome.passed, r.outcome.total) == (1, 2)


# ------------------------------------------------------------- 11. Python start-up files, env from files


@pytest.mark.docker
@pytest.mark.parametrize("where, content", [("/usr/bin/python3._pth", "/tmp/evil/lib/python3.11\n"),
                                            ("/usr/pyvenv.cfg", "home = /tmp/evil/bin\n")])
def test_interpreter_start_up_files_are_tampering(docker_client, settings, fixture_tasks, tokenizer, renderer,
                                                  where, content):
  """A ._pth file beside the interpreter or a pyvenv.cfg above it points even `python3 -I` at a standard library
  of the agent's: tampering (S = 0)."""
  cmds = ["mkdir -p /tmp/evil/lib && cp -a /usr/lib/python3.11 /tmp/evil/lib/ && "
          "echo 'print(\"PWNED-STDLIB\")' >> /tmp/evil/lib/python3.11/fnmatch.py",
          write(where, content) + " && /usr/bin/python3 -I -c 'import fnmatch' 2>&1 | head -3"]
  r = run_episode(fixture_tasks["harbor-greeting"], agent(tokenizer, renderer, cmds), docker_client, settings)
  assert "PWNED-STDLIB" in r.turns[1].observation  # it works for the agent's own Python
  assert r.success == 0 and r.outcome.state == INVALID and "tampered" in r.outcome.reason
  assert where in r.error


@pytest.mark.docker
def test_variables_in_shell_and_login_files_do_not_reach_the_verifier(tmp_path, docker_client, settings,
                                                                       tokenizer, renderer):
  """PYTHON* / BASH_ENV / ENV written to /etc/environment and the profile and rc files: the verifier runs
  `bash <script>` (neither a login nor an interactive shell) with the image's, the task's and its own
  variables, so none of them reaches the script or the shells it starts (already closed; kept as a check)."""
  task = tb1_task(tmp_path, "tb1-env-files", dockerfile="FROM rsi-base\nWORKDIR /app\n",
                  tests={"test_outputs.py": "def test_ok():\n  assert True\n"},
                  run_tests="#!/bin/bash\necho \"probe [$PYTHONPATH] [$BASH_ENV] [$ENV] [$PYTHONSTARTUP] "
                            "[$RSI_MARK]\"\nbash -c 'echo \"sub [$RSI_MARK]\"'\n"
                            "cd /app && python3 -m pytest $TEST_DIR/test_outputs.py -rA\n")
  line = "export PYTHONPATH=/tmp/evil BASH_ENV=/tmp/evil.sh ENV=/tmp/evil.sh PYTHONSTARTUP=/tmp/evil.py RSI_MARK=1\n"
  files = ["/etc/environment", "/etc/profile", "/etc/profile.d/zz.sh", "/etc/bash.bashrc", "/root/.bashrc",
           "/root/.profile", "/root/.bash_profile"]
  cmds = [write("/tmp/evil.sh", "export RSI_MARK=bash-env\n"),
          " && ".join(f"echo {base64.b64encode(line.encode()).decode()} | base64 -d >> {f}" for f in files)]
  r = run_episode(task, agent(tokenizer, renderer, cmds), docker_client, settings)
  assert r.success == 1, (r.outcome.reason, r.verifier_output[-800:])
  probe = next(x for x in r.verifier_output.splitlines() if x.startswith("probe "))
  assert "/tmp/evil" not in probe and "[1]" not in probe and "sub []" in r.verifier_output


def test_protection_of_an_image_path():
  """The venv first on an image's PATH: its interpreter library, site-packages and pyvenv.cfg, its programs; and
  Python's start-up files beside or above any interpreter directory. Byte-code stays out (deleted instead)."""
  M, A, D = 0, 1, 2
  prot = protection("/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
  site = "/opt/venv/lib/python3.11/site-packages"
  changed = [(f"{site}/zz.pth", A), (f"{site}/sitecustomize.py", A), (f"{site}/_pytest/main.py", M),
             ("/opt/venv/pyvenv.cfg", M), ("/opt/venv/bin/python3", M), ("/opt/venv/bin/pytest", A),
             ("/opt/venv/bin/cat", A), ("/opt/venv/bin/activate", D), ("/usr/bin/pybuilddir.txt", A),
             ("/usr/bin/Modules/Setup.local", A), ("/usr/bin/python3._pth", A), ("/usr/pyvenv.cfg", A),
             ("/usr/local/bin/pyvenv.cfg", A), (f"{site}/__pycache__/x.cpython-311.pyc", A), ("/opt/venv", M),
             ("/app/venv/pyvenv.cfg", A), ("/app/venv/lib/python3.11/site-packages/x.pth", A), ("/opt/other/x", A)]
  entries = [{"Path": p, "Kind": k} for p, k in changed]
  assert tampered_paths(entries, prot) == [
      f"{site}/zz.pth", f"{site}/sitecustomize.py", f"{site}/_pytest/main.py", "/opt/venv/pyvenv.cfg",
      "/opt/venv/bin/python3", "/opt/venv/bin/pytest", "/opt/venv/bin/activate", "/usr/bin/pybuilddir.txt",
      "/usr/bin/Modules/Setup.local", "/usr/bin/python3._pth", "/usr/pyvenv.cfg", "/usr/local/bin/pyvenv.cfg"]
  assert "/opt/venv/bin" in prot.dirs and prot.programs.match("/opt/venv/bin/cat")  # checked for shadowing
  # the standard PATH: no venv protected, start-up files still are
  std = tampered_paths(entries, protection(VERIFIER_PATH))
  assert f"{site}/zz.pth" not in std and "/usr/bin/python3._pth" in std and "/usr/pyvenv.cfg" in std
  assert agent_bytecode([{"Path": p, "Kind": A} for p in (
      f"{site}/__pycache__/venvonly.cpython-311.opt-1.pyc", f"{site}/pytest.pyc", "/app/__pycache__/x.pyc",
      "/usr/lib/python3.11/fnmatch.pyc")], prot) == [
      f"{site}/__pycache__/venvonly.cpython-311.opt-1.pyc", f"{site}/pytest.pyc", "/usr/lib/python3.11/fnmatch.pyc"]


def test_restore_plan(tmp_path):
  """What goes before the private files are put back: the agent's additions inside the copied folder and pytest
  configuration it wrote beside or above a restored file; nothing else of its work."""
  task = tb1_task(tmp_path, "tb1-plan", dockerfile="FROM rsi-base\nWORKDIR /app\nCOPY tests/ /app/tests/\n"
                  "COPY run-tests.sh /app/run-tests.sh\n", tests={"test_outputs.py": ""}, run_tests="#!/bin/bash\n")
  M, A, D = 0, 1, 2
  changed = [("/app", M), ("/app/tests", M), ("/app/tests/test_outputs.py", A), ("/app/tests/conftest.py", A),
             ("/app/tests/sub", A), ("/app/tests/sub/conftest.py", A), ("/app/tests/__pycache__", A),
             ("/app/conftest.py", A), ("/app/pytest.ini", M), ("/app/pyproject.toml", A), ("/app/run-tests.sh", D),
             ("/app/main.cpp", M), ("/app/src/conftest.py", A), ("/conftest.py", A)]
  assert restore_plan(task, [{"Path": p, "Kind": k} for p, k in changed]) == [
      "/app/conftest.py", "/app/pyproject.toml", "/app/pytest.ini", "/app/tests/__pycache__",
      "/app/tests/conftest.py", "/app/tests/sub"]


# ---------------------------------------------------------------------- 6. tests that need the network


def _tb1_pytest(root: Path, name: str, test: str):
  return tb1_task(root, name, dockerfile="FROM rsi-base\nWORKDIR /app\n", tests={"test_outputs.py": test},
                  run_tests="#!/bin/bash\ncd /app\npython3 -m pytest $TEST_DIR/test_outputs.py --tb=short -rA\n")


@pytest.mark.docker
@pytest.mark.parametrize("how", ["curl-host", "python-address", "loopback"])
def test_tests_that_need_the_network(tmp_path, docker_client, settings, tokenizer, renderer, how):
  """Offline, a test that reaches an outside judge (a host name: it does not resolve; an address: the network
  is unreachable) is an infrastructure failure (needs_network), never scored; one that connects to a local
  port nobody listens on (a server the agent should have started) is the task's: scored 0."""
  test = {
      "curl-host": "import subprocess\n\ndef test_judge():\n  assert subprocess.run(['curl', '-sS', "
                   "'https://judge.example.com/health']).returncode == 0\n",
      "python-address": "import urllib.request\n\ndef test_judge():\n  urllib.request.urlopen("
                        "'http://192.0.2.10:8081/health', timeout=5)\n",
      "loopback": "import socket\n\ndef test_server():\n  socket.create_connection(('127.0.0.1', 9), timeout=5)\n",
  }[how]
  r = run_episode(_tb1_pytest(tmp_path, f"tb1-net-{how}", test), agent(tokenizer, renderer, []), docker_client,
                  settings)
  if how == "loopback":
    assert r.outcome.state == OK and r.success == 0 and r.outcome.total == 1, (r.outcome.reason, r.error)
    return
  assert r.infra_failure and r.failure_kind == NEEDS_NETWORK and r.success is None, (r.outcome.reason, r.error)
  assert ("Could not resolve host: judge.example.com" if how == "curl-host" else "Network is unreachable") in r.error
  assert NEEDS_NETWORK in _NOT_RETRIED


def test_network_failure_lines():
  out = ("Err:1 http://deb.debian.org/debian bookworm InRelease\n  Temporary failure resolving 'deb.debian.org'\n"
         "curl: (6) Could not resolve host: astral.sh\n"
         "============================= test session starts ==============================\n"
         "E   ConnectionRefusedError: [Errno 111] Connection refused\n"
         "E   OSError: [Errno 101] Network is unreachable (connecting to ::1)\n"
         "E   urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>\n")
  assert network_failure(out) == ("E urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name "
                                  "resolution>")
  before = "curl: (6) Could not resolve host: astral.sh\nFAILED x\n"  # no pytest session: the whole output
  assert network_failure(before) == "curl: (6) Could not resolve host: astral.sh"
  assert network_failure(before, ignore=("astral.sh",)) == ""  # an installer the verifier satisfied
  assert network_failure("Exception in thread \"main\" java.net.UnknownHostException: services.gradle.org\n")
  assert network_failure("npm ERR! getaddrinfo ENOTFOUND registry.npmjs.org\n")
  assert network_failure("connect ENETUNREACH 10.0.0.1:443\n")
  assert not network_failure("connect ENETUNREACH 127.0.0.1:80\n")  # loopback: a server that is not there
  assert network_failure("E   ConnectionRefusedError: [Errno 111] Connection refused\n") == ""


# ----------------------------------------------------------------------------- 7. a verifier that never ran


@pytest.mark.docker
@pytest.mark.parametrize("how", ["runner-missing", "file-not-found", "bad-arguments", "collection-error"])
def test_a_runner_that_never_ran(tmp_path, docker_client, settings, tokenizer, renderer, how):
  """A runner that is not there, or a pytest session that ends with a usage error, is the verifier's failure
  (verifier_error, never scored); a collection error the agent's code causes (a missing module: exit status 2)
  stays a scored failure."""
  test = "import sys\nsys.path.insert(0, '/app')\nimport solution\n\ndef test_it():\n  assert solution.ANSWER == 42\n"
  run = {"runner-missing": "tb-pytest-runner $TEST_DIR/test_outputs.py -rA",
         "file-not-found": "python3 -m pytest $TEST_DIR/test_missing.py -rA",
         "bad-arguments": "python3 -m pytest --no-such-option $TEST_DIR/test_outputs.py -rA",
         "collection-error": "python3 -m pytest $TEST_DIR/test_outputs.py -rA"}[how]
  task = tb1_task(tmp_path, f"tb1-runner-{how}", dockerfile="FROM rsi-base\nWORKDIR /app\n",
                  tests={"test_outputs.py": test}, run_tests=f"#!/bin/bash\ncd /app\n{run}\n")
  r = run_episode(task, agent(tokenizer, renderer, []), docker_client, settings)
  if how == "collection-error":
    assert r.outcome.state == INVALID and r.success == 0 and r.outcome.trainable, (r.outcome.reason, r.error)
    assert "exit status 2" in r.outcome.reason
    return
  assert r.infra_failure and r.failure_kind == VERIFIER_ERROR and r.success is None, (r.outcome.reason, r.error)
  expect = {"runner-missing": "never ran", "file-not-found": "usage error (exit status 4)",
            "bad-arguments": "never ran"}[how]
  assert expect in r.error
  if how == "runner-missing":
    assert "tb-pytest-runner: command not found" in r.error  # the last line of the output
