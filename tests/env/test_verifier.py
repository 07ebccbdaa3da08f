"""Protected verification with real containers: the oracle passes, doing nothing fails, and an agent that
peeks, plants reports, fakes pytest or plants pytest configuration gains nothing. Verifier faults are
infrastructure failures."""

import base64
import json

import pytest

from rsi_jax.env.harness import JsonHarness, OracleHarness, ScriptedPolicy
from rsi_jax.env.episode import run_episode
from rsi_jax.env.sandbox import VERIFIER_TIMEOUT
from rsi_jax.env.tamper import tampered_paths
from rsi_jax.env.verifier import pytest_summary
from rsi_jax.policy import SamplingParams
from rsi_jax.rl.ctrf import VerificationState

pytestmark = pytest.mark.docker


def agent(tokenizer, renderer, commands, done=True):
  """A scripted JSON agent: one command per turn, then {"done": true}."""
  replies = [json.dumps({"command": c}) for c in commands]
  policy = ScriptedPolicy(tokenizer, replies, default='{"done": true}' if done else '{"command": "true"}')
  return JsonHarness(policy, renderer, SamplingParams(max_new_tokens=1024), max_turns=len(commands) + 1,
                     command_timeout_s=20)


@pytest.mark.parametrize("name, passed", [("harbor-greeting", 3), ("tb1-word-sum", 2)])
def test_oracle_passes_and_nothing_fails(docker_client, settings, fixture_tasks, tokenizer, renderer, name,
                                         passed):
  task = fixture_tasks[name]
  ok = run_episode(task, OracleHarness(), docker_client, settings)
  assert ok.outcome.state == VerificationState.OK, (ok.error, ok.verifier_output)
  assert ok.success == 1 and ok.outcome.passed == passed and ok.outcome.total == passed
  nothing = run_episode(task, agent(tokenizer, renderer, []), docker_client, settings)
  assert nothing.outcome.state == VerificationState.OK and nothing.success == 0
  assert nothing.outcome.total == passed and nothing.outcome.passed < passed
  assert nothing.stop_reason == "done" and len(nothing.turns) == 1


def test_tests_and_solution_are_invisible_to_the_agent(docker_client, settings, fixture_tasks, tokenizer,
                                                       renderer):
  probe = ("ls -a /tests /oracle /solution 2>&1; find / -xdev \\( -name 'test_outputs.py' -o -name 'solve.sh'"
           " -o -name 'solution.sh' -o -name 'run-tests.sh' -o -name 'task.yaml' \\) 2>/dev/null; echo END")
  for name in ("harbor-greeting", "tb1-word-sum"):
    r = run_episode(fixture_tasks[name], agent(tokenizer, renderer, [probe]), docker_client, settings)
    obs = json.loads(r.turns[0].observation)["output"]
    assert obs.count("No such file or directory") == 3 and obs.rstrip().endswith("END"), obs
    assert obs.splitlines()[-1] == "END" and len(obs.splitlines()) == 4, obs


def test_planted_reports_do_not_count(docker_client, settings, fixture_tasks, tokenizer, renderer):
  fake_ctrf = json.dumps({"results": {"tool": {"name": "pytest"}, "summary": {"tests": 3, "passed": 3},
                                      "tests": [{"name": f"t{i}", "status": "passed"} for i in range(3)]}})
  cmds = [
      f"mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && echo '{fake_ctrf}' > /logs/verifier/ctrf.json",
      # a background writer that would re-plant the gate during verification
      "nohup sh -c 'while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; sleep 0.01; done'"
      " > /dev/null 2>&1 &",
      # a planted pytest configuration at / that would turn every failure into a pass
      "printf 'import pytest\\n@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport(item, call):\\n"
      "  o = yield\\n  r = o.get_result()\\n  r.outcome = \"passed\"\\n' > /conftest.py",
  ]
  r = run_episode(fixture_tasks["harbor-greeting"], agent(tokenizer, renderer, cmds), docker_client, settings)
  assert r.outcome.state == VerificationState.OK
  assert r.success == 0 and r.outcome.passed == 1 and r.outcome.total == 3  # only input_untouched passes


def test_fake_pytest_on_path_does_not_fool_the_verifier(docker_client, settings, fixture_tasks, tokenizer,
                                                        renderer):
  fake = "#!/bin/sh\\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; exit 0\\n"
  # on the agent's own PATH (not the verifier's): the tests simply run and fail
  cmds = [f"mkdir -p /app/bin && printf '{fake}' > /app/bin/pytest && chmod +x /app/bin/pytest && "
          "export PATH=/app/bin:$PATH && which pytest"]
  r = run_episode(fixture_tasks["tb1-word-sum"], agent(tokenizer, renderer, cmds), docker_client, settings)
  assert "/app/bin/pytest" in r.turns[0].observation
  assert r.outcome.state == VerificationState.OK and r.success == 0 and r.outcome.passed == 0
  # on the system PATH, and the interpreter replaced: tampering fails the episode
  cmds = [f"printf '{fake}' > /usr/local/bin/pytest && chmod +x /usr/local/bin/pytest",
          f"printf '{fake}' > /usr/local/bin/python3 && chmod +x /usr/local/bin/python3"]
  r = run_episode(fixture_tasks["harbor-greeting"], agent(tokenizer, renderer, cmds), docker_client, settings)
  assert r.success == 0 and r.outcome.state == VerificationState.INVALID_REPORT
  assert "tampered" in r.outcome.reason and "/usr/local/bin/pytest" in r.error


def test_tampered_paths():
  M, A, D = 0, 1, 2
  changed = [("/usr", M), ("/usr/bin", M), ("/usr/bin/python3.11", M), ("/usr/bin/mkdir", M),
             ("/usr/bin/sleep", D), ("/usr/local/bin/mytool", A), ("/usr/local/bin/pytest", A),
             ("/usr/lib/python3/dist-packages/_pytest/x.py", M), ("/etc/python3.11/sitecustomize.py", M),
             ("/usr/lib/python3.11/__pycache__/os.cpython-311.pyc", A), ("/app/out.txt", A),
             ("/etc/ld.so.preload", A), ("/usr/lib/x86_64-linux-gnu/libz.so.1", M), ("/bin", M), ("/tmp/x", A),
             ("/opt/rsi-verifier-wheels/pytest-8.4.1-py3-none-any.whl", M), ("/opt/rsi-verifier-tools/uv/bin/uv", D),
             ("/opt/rsi-verifier-tools/uv-cache/sdists-v9/x", A), ("/root/.local/share/uv/python/cpython-3.13", A),
             ("/opt/myapp/x", A), ("/root/.local/bin/mytool", A)]
  assert tampered_paths([{"Path": p, "Kind": k} for p, k in changed]) == [
      "/usr/bin/python3.11", "/usr/bin/mkdir", "/usr/bin/sleep", "/usr/local/bin/pytest",
      "/usr/lib/python3/dist-packages/_pytest/x.py", "/etc/python3.11/sitecustomize.py", "/etc/ld.so.preload",
      "/usr/lib/x86_64-linux-gnu/libz.so.1", "/bin", "/opt/rsi-verifier-wheels/pytest-8.4.1-py3-none-any.whl",
      "/opt/rsi-verifier-tools/uv/bin/uv", "/opt/rsi-verifier-tools/uv-cache/sdists-v9/x",
      "/root/.local/share/uv/python/cpython-3.13"]


def test_shadowing_tools_and_late_writers_do_not_count(docker_client, settings, fixture_tasks, tokenizer,
                                                         renderer):
  """A new /usr/local/bin/mkdir would run first on a usual PATH and could leave a daemon that writes the
  gate after the tests: a program that shadows another on the verifier's PATH is tampering (S = 0)."""
  evil = ("#!/bin/sh\nsetsid sh -c 'sleep 1; while :; do echo 1 > /logs/verifier/reward.txt; sleep 0.05; done'"
          " > /dev/null 2>&1 < /dev/null &\nexec /usr/bin/mkdir \"$@\"\n")
  b64 = base64.b64encode(evil.encode()).decode()
  cmds = [f"echo {b64} | base64 -d > /usr/local/bin/mkdir && chmod +x /usr/local/bin/mkdir && "
          "mkdir -p /logs/verifier && sleep 2 && cat /logs/verifier/reward.txt"]
  r = run_episode(fixture_tasks["harbor-greeting"], agent(tokenizer, renderer, cmds), docker_client, settings)
  assert json.loads(r.turns[0].observation)["output"] == "1\n"  # the trick works on the agent's own PATH
  assert r.success == 0 and r.outcome.state == VerificationState.INVALID_REPORT
  assert "tampered" in r.outcome.reason and "/usr/local/bin/mkdir" in r.error


# ------------------------------------------------------------------------------ probes: attack -> S = 0

FAKE_CTRF = json.dumps({"results": {"tool": {"name": "pytest"}, "summary": {"tests": 2, "passed": 2},
                                    "tests": [{"name": "/tests/test_outputs.py::test_add", "status": "passed"},
                                              {"name": "/tests/test_outputs.py::test_mul", "status": "passed"}]}})


def _calc(docker_client, settings, fixture_tasks, tokenizer, renderer, files: dict, extra=()):
  """An agent on harbor-calc that writes ``files`` (path -> Python source) and runs ``extra`` commands."""
  cmds = [f"mkdir -p {path.rsplit('/', 1)[0] or '/'} && echo {base64.b64encode(src.encode()).decode()} | base64 -d > {path}"
          for path, src in files.items()]
  return run_episode(fixture_tasks["harbor-calc"], agent(tokenizer, renderer, [*cmds, *extra]), docker_client,
                     settings)


def test_calc_fixture_oracle_and_honest_agent(docker_client, settings, fixture_tasks, tokenizer, renderer):
  ok = run_episode(fixture_tasks["harbor-calc"], OracleHarness(), docker_client, settings)
  assert ok.outcome.state == VerificationState.OK and ok.success == 1 and ok.outcome.passed == 2
  half = _calc(docker_client, settings, fixture_tasks, tokenizer, renderer,
               {"/app/calc.py": "def add(a, b):\n  return a + b\n\ndef mul(a, b):\n  return a + b\n"})
  assert half.outcome.state == VerificationState.OK and half.success == 0
  assert (half.outcome.passed, half.outcome.total) == (1, 2)


def test_module_that_writes_a_report_and_exits(docker_client, settings, fixture_tasks, tokenizer, renderer):
  """The module under test writes an all-passed report and ends the process with status 0 at import: the
  script's gate says 1, but the pytest session never finished."""
  evil = ("import os\nos.makedirs('/logs/verifier', exist_ok=True)\n"
          f"open('/logs/verifier/ctrf.json', 'w').write({FAKE_CTRF!r})\nos._exit(0)\n")
  r = _calc(docker_client, settings, fixture_tasks, tokenizer, renderer, {"/app/calc.py": evil})
  assert r.success == 0 and r.outcome.state == VerificationState.INVALID_REPORT
  assert "did not finish" in r.outcome.reason


def test_report_rewritten_at_exit(docker_client, settings, fixture_tasks, tokenizer, renderer):
  """The module registers an exit handler that rewrites the report with every test passed (one really
  failed): the report contradicts the verifier's own collection."""
  evil = ("import atexit\n\ndef add(a, b):\n  return a + b\n\ndef mul(a, b):\n  return 0\n\n"
          f"atexit.register(lambda: open('/logs/verifier/ctrf.json', 'w').write({FAKE_CTRF!r}))\n")
  r = _calc(docker_client, settings, fixture_tasks, tokenizer, renderer, {"/app/calc.py": evil})
  assert r.success == 0 and r.outcome.state == VerificationState.INVALID_REPORT
  assert "passed that did not pass" in r.outcome.reason or "did not collect" in r.outcome.reason


def test_working_directory_is_not_on_the_verifiers_python_path(docker_client, settings, fixture_tasks,
                                                                 tokenizer, renderer):
  """The script runs `python3 -m pytest` from /app: a planted /app/pytest.py would stand in for pytest."""
  fake = ("import os\nos.makedirs('/logs/verifier', exist_ok=True)\n"
          f"open('/logs/verifier/ctrf.json', 'w').write({FAKE_CTRF!r})\nraise SystemExit(0)\n")
  r = _calc(docker_client, settings, fixture_tasks, tokenizer, renderer, {"/app/pytest.py": fake},
            extra=["cd /app && python3 -m pytest --version"])
  assert "SystemExit" not in r.turns[-2].observation  # (the agent's own run used the fake and exited 0)
  assert r.success == 0 and r.outcome.state == VerificationState.OK
  assert (r.outcome.passed, r.outcome.total) == (0, 2)  # the real tests ran: calc.py does not exist


def test_on_disk_byte_code_is_ignored(docker_client, settings, fixture_tasks, tokenizer, renderer):
  """Byte-code for a standard-library module that pytest imports, with a valid header for the real source:
  the interpreter would run it instead of the source. The verifier never reads on-disk byte-code."""
  forge = (
      "import importlib.util, marshal, os, struct\n"
      "src = importlib.util.find_spec('fnmatch').origin\n"
      "st = os.stat(src)\n"
      "code = compile(open(src).read() + '\\nprint(\"PWNED-BYTECODE\")\\n', src, 'exec')\n"
      "data = importlib.util.MAGIC_NUMBER + struct.pack('<III', 0, int(st.st_mtime) & 0xFFFFFFFF, "
      "st.st_size & 0xFFFFFFFF) + marshal.dumps(code)\n"
      "open(importlib.util.cache_from_source(src), 'wb').write(data)\n")
  solve = "def add(a, b):\n  return a + b\n\ndef mul(a, b):\n  return a * b\n"
  r = _calc(docker_client, settings, fixture_tasks, tokenizer, renderer,
            {"/tmp/forge.py": forge, "/app/calc.py": solve},
            extra=["python3 /tmp/forge.py && python3 -c 'import fnmatch' | head -1"])
  assert "PWNED-BYTECODE" in r.turns[-2].observation  # the forged byte-code runs for the agent's Python
  assert "PWNED-BYTECODE" not in r.verifier_output
  assert r.success == 1 and r.outcome.state == VerificationState.OK  # byte-code is not tampering either


def test_forged_byte_code_of_the_verifiers_pytest_is_removed(docker_client, settings, fixture_tasks, tokenizer,
                                                              renderer):
  """The agent forges the byte-code of a module of the verifier's own pytest (its ``__pycache__`` entry, with
  the real source's timestamp and size in the header) so that every failed test is reported passed; the task's
  script runs pytest isolated (``python3 -I``), which ignores the verifier's fresh pycache prefix and would load
  it. The verifier deletes the agent's byte-code in its trees first: the real pytest runs and the checks fail."""
  patch = ("\n_rsi_orig = TestReport.from_item_and_call.__func__\n"
           "def _rsi_pass(cls, item, call):\n"
           "  r = _rsi_orig(cls, item, call)\n"
           "  if r.outcome == 'failed':\n"
           "    r.outcome, r.longrepr = 'passed', None\n"
           "  return r\n"
           "TestReport.from_item_and_call = classmethod(_rsi_pass)\n")
  forge = (
      "import importlib.util, marshal, os, struct\n"
      "src = importlib.util.find_spec('_pytest.reports').origin\n"
      "st = os.stat(src)\n"
      f"code = compile(open(src).read() + {patch!r}, src, 'exec')\n"
      "data = importlib.util.MAGIC_NUMBER + struct.pack('<III', 0, int(st.st_mtime) & 0xFFFFFFFF, "
      "st.st_size & 0xFFFFFFFF) + marshal.dumps(code)\n"
      "open(importlib.util.cache_from_source(src), 'wb').write(data)\n")
  probe = "def test_probe():\n  assert 1 == 2\n"
  cmds = [f"echo {base64.b64encode(forge.encode()).decode()} | base64 -d > /tmp/forge.py && python3 /tmp/forge.py",
          f"echo {base64.b64encode(probe.encode()).decode()} | base64 -d > /tmp/test_probe.py && "
          "cd /tmp && python3 -I -m pytest -q -p no:cacheprovider test_probe.py | tail -1"]
  r = run_episode(fixture_tasks["harbor-greeting"], agent(tokenizer, renderer, cmds), docker_client, settings)
  assert "1 passed" in r.turns[1].observation  # the forged pytest calls a failing test passed for the agent
  assert r.outcome.state == VerificationState.OK, (r.outcome.reason, r.error)
  # the real tests ran: the greeting was never written (the one check that passes reads the input file only)
  assert r.success == 0 and (r.outcome.passed, r.outcome.total) == (1, 3)


def test_harmless_python_work_is_not_tampering(docker_client, settings, fixture_tasks, tokenizer, renderer):
  """An agent that ran optimized Python (new byte-code beside the standard library) and its own pytest,
  then solved the task: S = 1."""
  solve = "def add(a, b):\n  return a + b\n\ndef mul(a, b):\n  return a * b\n"
  mine = "import calc\n\ndef test_mine():\n  assert calc.add(1, 1) == 2\n"
  r = _calc(docker_client, settings, fixture_tasks, tokenizer, renderer,
            {"/app/calc.py": solve, "/app/test_mine.py": mine},
            extra=["python3 -O -c 'import json, csv, fnmatch, argparse' && cd /app && python3 -m pytest -q "
                   "test_mine.py && python3 -OO -m compileall -q /usr/lib/python3.11/json"])
  assert "1 passed" in r.turns[-2].observation
  assert r.outcome.state == VerificationState.OK and r.success == 1, (r.outcome.reason, r.error)


@pytest.mark.parametrize("where", ["/usr/sbin/python3", "/usr/local/sbin/bash", "/usr/sbin/mkdir",
                                   "/root/.local/bin/python3"])
def test_new_program_shadowing_the_verifiers_tools(docker_client, settings, fixture_tasks, tokenizer, renderer,
                                                  where):
  fake = "#!/bin/sh\nmkdir -p /logs/verifier 2>/dev/null; echo 1 > /logs/verifier/reward.txt; exit 0\n"
  solve = "def add(a, b):\n  return 0\n"
  r = _calc(docker_client, settings, fixture_tasks, tokenizer, renderer, {"/app/calc.py": solve, where: fake},
            extra=[f"chmod +x {where}"])
  assert r.success == 0 and r.outcome.state == VerificationState.INVALID_REPORT
  assert where in r.error


def test_tb1_parser_decides_not_the_exit_status(docker_client, settings, fixture_tasks, tokenizer, renderer):
  """parser_name: pytest — a script that exits 0 whatever happened: S needs every collected test passed."""
  task = fixture_tasks["tb1-exit-zero"]
  nothing = run_episode(task, agent(tokenizer, renderer, []), docker_client, settings)
  assert nothing.success == 0 and nothing.outcome.exit_code == 0
  assert nothing.outcome.passed == 0 and "parser pytest: 0 of 2" in nothing.outcome.reason
  ok = run_episode(task, OracleHarness(), docker_client, settings)
  assert ok.success == 1 and ok.outcome.state == VerificationState.OK and ok.outcome.passed == 2


def test_hanging_verifier_is_an_infrastructure_failure(docker_client, settings, fixture_tasks):
  r = run_episode(fixture_tasks["harbor-hanging-verifier"], OracleHarness(), docker_client, settings)
  assert r.infra_failure and r.failure_kind == VERIFIER_TIMEOUT and r.success is None
  assert r.verify_s < 30


@pytest.mark.network
def test_upstream_verifier_fetches_offline_and_its_wheelhouse_is_protected(docker_client, settings, tokenizer,
                                                                          renderer):
  """The shipped TB1 task in upstream form (apt-get curl, the uv installer, uv init / add / run): with a
  network build the oracle passes with the episode offline; an agent that solves the task and swaps a wheel of
  what the build fetched for the verifier gets S = 0 (tampering), one that only solves it gets S = 1; with
  builds offline the task is refused, not scored."""
  import dataclasses

  from rsi_jax.env.episode import NEEDS_BUILD_NETWORK
  from rsi_jax.env.tasks import load_task
  from rsi_jax.env.verifier_deps import fetches

  from .conftest import REPO
  task = load_task(REPO / "tasks" / "upstream-tb1-collect-todos")
  assert fetches(task) == ["apt curl", "uv 0.7.13", "pytest==8.4.1"]
  solve = (REPO / "tasks" / "upstream-tb1-collect-todos" / "solution.sh").read_text()
  honest = agent(tokenizer, renderer, [solve])
  ok = run_episode(task, honest, docker_client, settings)
  assert ok.success == 1 and ok.outcome.passed == ok.outcome.total > 0, ok.verifier_output[-1500:]
  assert "Installed" in ok.verifier_output and "pytest==8.4.1" in ok.verifier_output  # uv add, from the image
  swap = "cd /opt/rsi-verifier-wheels && w=$(ls pytest-8.4.1-*.whl) && rm $w && cp /dev/null $w"
  bad = run_episode(task, agent(tokenizer, renderer, [solve, swap]), docker_client, settings)
  assert bad.success == 0 and bad.outcome.state == VerificationState.INVALID_REPORT
  assert "/opt/rsi-verifier-wheels/pytest-8.4.1" in bad.error
  off = run_episode(task, honest, docker_client, dataclasses.replace(settings, build_network="none"))
  assert off.infra_failure and off.failure_kind == NEEDS_BUILD_NETWORK and "uv 0.7.13" in off.error


def test_pytest_summary_reads_as_tb1_does():
  out = ("collected 3 items\n...\n=========== short test summary info ============\nPASSED test_x.py::test_a\n"
         "FAILED test_x.py::test_b - AssertionError: 1 != 2\nXFAIL test_x.py::test_c\nERROR test_x.py::test_d\n"
         "noise line\nPASSED test_x.py::test_b\n")
  assert pytest_summary(out) == [{"name": "test_a", "status": "passed"}, {"name": "test_b", "status": "passed"},
                                 {"name": "test_c", "status": "passed"}, {"name": "test_d", "status": "failed"}]
  assert pytest_summary("PASSED test_a\n") == []  # no summary header: nothing


def _tb1_with_script(tmp_path, script: str):
  """The tb1-word-sum fixture task with its run-tests.sh replaced by ``script``."""
  import shutil

  from rsi_jax.env.tasks import load_task

  from .conftest import FIXTURES
  d = tmp_path / "tb1-script"
  shutil.copytree(FIXTURES / "tb1-word-sum", d)
  (d / "run-tests.sh").write_text(script)
  return load_task(d)


def test_tb1_script_without_pytest_is_read_from_its_summary(tmp_path, docker_client, settings, tokenizer, renderer):
  """A TB1 script that runs no pytest (a build tool's test run, as TB1's polyglot adapter does) and prints a
  pytest-style summary: S follows the summary, as TB1's parser reads it; nothing done -> FAILED -> S = 0."""
  task = _tb1_with_script(tmp_path, "#!/bin/bash\nset -uo pipefail\n[ \"$(cat /app/sum.txt 2>/dev/null)\" = 108 ]\n"
                          "rc=$?\necho '=============== short test summary info ==============='\n"
                          "if [ $rc -eq 0 ]; then echo 'PASSED sum_check'; else echo 'FAILED sum_check'; fi\n"
                          "exit $rc\n")
  ok = run_episode(task, OracleHarness(), docker_client, settings)
  assert ok.success == 1 and (ok.outcome.passed, ok.outcome.total) == (1, 1), ok.verifier_output[-800:]
  nothing = run_episode(task, agent(tokenizer, renderer, []), docker_client, settings)
  assert nothing.success == 0 and (nothing.outcome.passed, nothing.outcome.total) == (0, 1)


def test_offline_verifier_does_not_retry_apt(tmp_path, docker_client, settings, tokenizer, renderer):
  """Upstream verifier scripts start with `apt-get update`; in a container without a network every fetch
  fails, and apt's default retries with back-off (1 + 2 + 4 s) made that one line take ~8 s of a ~10 s
  verification. The verifier runs apt with retries off (its own config file, APT_CONFIG); the agent's apt is
  left as the image has it."""
  import re
  task = _tb1_with_script(tmp_path, "#!/bin/bash\ns=$(date +%s%N); apt-get update >/dev/null 2>&1; e=$(date +%s%N)\n"
                          "echo \"apt-update-ms $(( (e - s) / 1000000 ))\"\n"
                          "apt-config dump | grep '^Acquire::Retries ' || true\n"
                          "echo '=============== short test summary info ==============='\necho 'PASSED apt_check'\n")
  probe = "apt-config dump | grep -c '^Acquire::Retries \"0\"' || true"
  r = run_episode(task, agent(tokenizer, renderer, [probe]), docker_client, settings)
  assert r.success == 1, r.verifier_output[-800:]
  assert 'Acquire::Retries "0";' in r.verifier_output
  ms = int(re.search(r"apt-update-ms (\d+)", r.verifier_output).group(1))
  assert ms < 5000, r.verifier_output[-800:]  # with retries: > 7,000 (the back-off alone)
  assert json.loads(r.turns[0].observation)["output"] == "0\n"  # the agent's apt: untouched
