"""Protected verification: run a task's tests only after the agent has finished (SPEC §6, paper §2.2).

Order of operations in the episode's container, once the agent's last command has returned:

1. stop every process the agent left behind (``kill -KILL -1``; PID 1 is exempt), so nothing can write
   into ``/logs/verifier`` or ``/tests`` while the verifier runs;
2. look for tampering with the tools the verifier runs on (``docker diff``, against
   :func:`rsi_jax.env.tamper.protection` of the effective PATH: the image's own, see step 4): changed or
   deleted programs in a directory on that PATH, the Python interpreters there and what decides where they
   look for their library (``pyvenv.cfg``, ``._pth``, ``pybuilddir.txt``, anything in a sub-folder of a bin
   directory), their library and site-packages (a venv's too), pytest, the dynamic loader and shared
   libraries, and a new program in a bin directory that shadows one of the same name elsewhere on that PATH);
   tampering fails the episode (S = 0). Parent-directory entries of ``docker diff`` and byte-code are not
   tampering (an agent that ran Python or its own pytest and then solved the task is not punished), but
   byte-code the agent added or changed in those trees is deleted before the tests run;
3. put back the private files the image copied and :func:`rsi_jax.env.episode.run_episode` hid from the agent
   (``Task.private_origin``: content from the task folder, mode as the image had it), after removing whatever
   the agent left at those paths, any link or file standing in for a folder above them, what it added inside a
   copied folder, and pytest configuration it wrote beside or above them; delete ``/logs/verifier``,
   ``/tests`` and pytest configuration files planted at ``/`` (with tools named by absolute path), then copy
   the task's tests to ``/tests`` (they were never in the container before) and the pytest guard
   (:mod:`rsi_jax.env.pytest_guard`);
4. run the test script with the image's own environment (its config's ``Env``, which the agent cannot change;
   PATH the image's, :data:`VERIFIER_PATH` if it sets none), then the task's ``[verifier.env]``, then the
   verifier's fixed variables (no agent variables, no user site-packages, the working directory never on
   Python's path (``PYTHONSAFEPATH``), on-disk byte-code ignored (a fresh ``PYTHONPYCACHEPREFIX``), the guard
   loaded into every pytest session, and, in a container without a network, apt fetches not retried:
   :data:`APT_OFFLINE_CONF`) under the verifier timeout, its whole process group killed at the timeout;
5. read ``/logs/verifier/ctrf.json``, the terminal gate (``reward.txt``; Terminal-Bench 1: the script's exit
   status and ``parser_name: pytest`` — every collected test passed) and the guard's session records into a
   :class:`rsi_jax.rl.ctrf.VerificationOutcome`. A pytest session that started but did not finish normally
   (a module under test that wrote a report and exited), a report naming tests the verifier did not
   collect or leaving collected ones out, a session record the verifier did not start, or a reward outside
   [0, 1] make the report invalid and S = 0.

A verifier that times out, a container that dies, or a Docker error is an infrastructure failure: neither
success nor failure (masked out of training and counted). So are tests that failed for want of a network in a
container without one (:data:`NEEDS_NETWORK`: the output names a host that does not resolve or an unreachable
network), a test runner that never ran (Terminal-Bench 1: no pytest session, report or summary, and the
script's runner not found) and a pytest session that ended with a usage or internal error (exit status 4 or
3: a test file not found, bad arguments): :data:`VERIFIER_ERROR`.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import re
import secrets
import shlex
import tarfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from rsi_jax.env.sandbox import (CONTAINER_DIED, DOCKER_ERROR, VERIFIER_ERROR, VERIFIER_TIMEOUT, DockerSandbox,
                                 SandboxError)
from rsi_jax.env.tamper import (VERIFIER_PATH, agent_bytecode, protection, restore_private, shadowing_programs,
                                tampered_paths)
from rsi_jax.env.tasks import LAYOUT_TB1, Task
from rsi_jax.env.verifier_deps import OFFLINE_ENV, uv_installer, uv_preseed_script
from rsi_jax.rl.ctrf import VerificationOutcome, VerificationState, verification_outcome

log = logging.getLogger(__name__)

# Failure kind: the tests needed the network and the container has none (never scored, not retried).
NEEDS_NETWORK = "needs_network"

LOGS_DIR = "/logs/verifier"
TESTS_DIR = "/tests"
# pytest picks these up from the ancestors of /tests, i.e. from "/".
PLANTED_CONFIG = ("/conftest.py", "/pytest.ini", "/tox.ini", "/setup.cfg", "/pyproject.toml")

# The pytest guard: its records, its module (on PYTHONPATH, and in the site-packages of the interpreters on
# the PATH for scripts that run Python isolated) and how pytest loads it (PYTEST_PLUGINS survives a script's
# `unset PYTEST_ADDOPTS` and PYTEST_DISABLE_PLUGIN_AUTOLOAD).
GUARD_DIR = "/logs/.rsi-guard"
GUARD_LIB = "/logs/.rsi-guard-lib"
GUARD_MODULE = "rsi_pytest_guard"
SYSTEM_SITE = "/usr/lib/python3/dist-packages"
GUARD_SOURCE = Path(__file__).with_name("pytest_guard.py")
# With the network off, apt's fetches can only fail, and apt retries each one with back-off (3 retries since apt
# 2.3: an offline `apt-get update`, which upstream verifier scripts start with, takes ~8 s instead of ~0.6 s).
# The verifier of a container without a network reads this file too (APT_CONFIG; apt.conf.d still applies).
APT_OFFLINE_CONF = f"{GUARD_LIB}/apt-offline.conf"
APT_OFFLINE = b'Acquire::Retries "0";\n'
NORMAL_EXIT = (0, 1)  # pytest: all passed / some tests failed; anything else did not finish normally
ENV_EXIT = (3, 4)  # pytest: internal / usage error (a test file not found, bad arguments): not the agent's


@dataclasses.dataclass(frozen=True)
class VerifierRun:
  """What one protected verification produced."""
  outcome: VerificationOutcome
  output: str  # the test script's output (capped)
  exit_code: int | None
  duration_s: float
  failure_kind: str = ""  # "" or a sandbox failure kind when the outcome is an infrastructure failure
  tampered: tuple[str, ...] = ()


_IMAGE_ENV: dict[str, dict[str, str]] = {}  # image id -> its config's Env (an image id names fixed content)
_IMAGE_ENV_LOCK = threading.Lock()


def image_env(sandbox: DockerSandbox) -> dict[str, str]:
  """The image's own environment (its config's ``Env``; the agent cannot change it), read once per image."""
  image_id = (sandbox.container.attrs or {}).get("Image")
  with _IMAGE_ENV_LOCK:
    known = _IMAGE_ENV.get(image_id) if image_id else None
  if known is not None:
    return dict(known)
  try:
    config = sandbox.container.image.attrs.get("Config") or {}
  except Exception as e:  # noqa: BLE001 - a docker-py / HTTP error: the verifier cannot run as the image says
    raise SandboxError(DOCKER_ERROR, f"{sandbox.task_name}: cannot read the image's environment: {e}") from None
  out = {}
  for item in config.get("Env") or []:
    k, sep, v = str(item).partition("=")
    if sep and k:
      out[k] = v
  if image_id:
    with _IMAGE_ENV_LOCK:
      _IMAGE_ENV[image_id] = dict(out)
  return out


def verify(sandbox: DockerSandbox, task: Task, *, timeout_s: float | None = None,
           hygiene_patterns=(), output_cap_bytes: int = 20_000,
           private_modes: Mapping[str, int] | None = None) -> VerifierRun:
  """Run the task's protected verifier in ``sandbox`` (after the agent finished). Never raises for
  sandbox problems: they become an infrastructure-failure outcome with ``failure_kind`` set.
  ``private_modes``: {container path: mode} of the private files the image copied, as read before the agent
  started (:func:`rsi_jax.env.episode.run_episode`)."""
  timeout_s = float(timeout_s or task.verifier_timeout_s)
  t0 = time.time()
  try:
    return _verify(sandbox, task, timeout_s, hygiene_patterns, output_cap_bytes, t0, private_modes)
  except SandboxError as e:
    out = verification_outcome(infra_error=str(e))
    return VerifierRun(out, "", None, time.time() - t0, failure_kind=e.kind)


def _verify(sandbox, task, timeout_s, hygiene_patterns, cap, t0, private_modes) -> VerifierRun:
  # 1. Nothing the agent started may outlive its turn.
  sandbox.exec_raw(["kill", "-KILL", "-1"], timeout_s=30)
  # The script's environment: the image's own, the task's, then the verifier's fixed variables.
  img = image_env(sandbox)
  path = task.verifier_env.get("PATH") or img.get("PATH") or VERIFIER_PATH
  prot = protection(path)
  # 2. Tampering with the verifier's tools fails the episode.
  changes = sandbox.changes()
  bad = tampered_paths(changes, prot)
  bad += [p for p in shadowing_programs(sandbox, changes, prot) if p not in bad]
  if bad:
    log.warning("%s: verifier tools changed by the agent: %s", task.name, bad[:5])
    out = verification_outcome(reward_text="0", exit_code=1)
    out = dataclasses.replace(out, state=VerificationState.INVALID_REPORT,
                              reason=f"verifier tools tampered with: {', '.join(bad[:5])}")
    return VerifierRun(out, "", None, time.time() - t0, tampered=tuple(bad))
  # 3. A clean slate: no pre-written report, no planted tests or pytest configuration, no byte-code of the
  # agent's in the verifier's own trees; the private files the image copied back as the image had them.
  stale = agent_bytecode(changes, prot)
  for i in range(0, len(stale), 500):
    rm = sandbox.exec_raw(["/bin/rm", "-rf", "--", *stale[i:i + 500]], timeout_s=60)
    if rm.exit_code != 0:
      raise SandboxError(VERIFIER_ERROR, f"could not remove the agent's byte-code: {rm.output[-300:]}")
  restore_private(sandbox, task, changes, private_modes)
  nonce = secrets.token_hex(16)
  # one exec: clear what an earlier report or the agent left, make the report folders, and list the
  # site-packages of each interpreter the script may run isolated (-I ignores PYTHONPATH) for the guard
  prep = sandbox.exec_raw(["/bin/bash", "-c", _PREPARE_SCRIPT, "prepare", *prot.dirs], timeout_s=30)
  if prep.exit_code != 0:
    raise SandboxError(VERIFIER_ERROR, f"could not clear {LOGS_DIR}: {prep.output[-300:]}")
  guard = {f"{GUARD_LIB}/{GUARD_MODULE}.py": GUARD_SOURCE.read_bytes()}
  for site in dict.fromkeys(prep.output.splitlines()):
    if site.startswith("/") and "\n" not in site:
      guard[f"{site}/{GUARD_MODULE}.py"] = guard[f"{GUARD_LIB}/{GUARD_MODULE}.py"]
  offline = sandbox.network == "none"
  if offline:
    guard[APT_OFFLINE_CONF] = APT_OFFLINE
  sandbox.put_dir(task.tests_dir, TESTS_DIR, extra=task.extra_test_files, files=guard)  # one copy
  # 4. The test script, with the image's environment, the task's, then fixed variables.
  pythonpath = task.verifier_env.get("PYTHONPATH", img.get("PYTHONPATH", ""))
  env = {**img, **task.verifier_env, "PATH": path, "TEST_DIR": TESTS_DIR, "PYTHONNOUSERSITE": "1",
         "PYTHONDONTWRITEBYTECODE": "1", "PYTHONSAFEPATH": "1", "PYTHONPYCACHEPREFIX": f"/tmp/.rsi-pycache-{nonce}",
         "PYTHONPATH": ":".join(x for x in (GUARD_LIB, pythonpath) if x),
         "PYTEST_PLUGINS": GUARD_MODULE, "RSI_GUARD_NONCE": nonce, "RSI_GUARD_DIR": GUARD_DIR,
         **OFFLINE_ENV}  # pip / uv install what the build fetched, from the image, with the network off
  if offline:
    env.setdefault("APT_CONFIG", APT_OFFLINE_CONF)
  workdir = (sandbox.container.attrs.get("Config") or {}).get("WorkingDir") or "/"
  if uv_installer(task) is not None:  # the script's uv installer step, satisfied from the image (verifier_deps)
    sandbox.exec_raw(["/bin/bash", "-c", uv_preseed_script()], timeout_s=30)
  res = sandbox.exec_raw(["/bin/bash", task.test_script], timeout_s=timeout_s, env=env, workdir=workdir,
                         cap_bytes=cap)
  if res.timed_out:
    out = verification_outcome(infra_error=f"verifier timed out after {timeout_s:g}s")
    return VerifierRun(out, res.output, None, time.time() - t0, failure_kind=VERIFIER_TIMEOUT)
  if not sandbox.is_running():
    raise SandboxError(CONTAINER_DIED, f"container of {task.name} is gone after verification")
  # 5. The report and the terminal gate, once nothing the test script started can still write them.
  sandbox.exec_raw(["kill", "-KILL", "-1"], timeout_s=30)
  ctrf = sandbox.get_file(f"{LOGS_DIR}/ctrf.json")
  reward = sandbox.get_file(f"{LOGS_DIR}/reward.txt")
  network = network_failure(res.output, ignore=_satisfied_hosts(task)) if offline else ""

  def infra(kind: str, why: str) -> VerifierRun:
    log.warning("%s: verification is an infrastructure failure (%s): %s", task.name, kind, why)
    return VerifierRun(verification_outcome(infra_error=why), res.output, res.exit_code, time.time() - t0,
                       failure_kind=kind)

  if task.layout != LAYOUT_TB1 and reward is None:
    # Harbor's verifier must write reward.txt; without it the verifier itself broke.
    if network:
      return infra(NEEDS_NETWORK, f"the tests need the network, which the container does not have: {network}")
    return infra(VERIFIER_ERROR, f"verifier wrote no reward.txt (exit {res.exit_code})")
  sessions = _guard_sessions(sandbox)
  problem = session_problem(sessions, nonce)
  broken = "" if problem else session_error(sessions)
  collected = {t: o for s in sessions for t, o in (s.get("outcomes") or {}).items()}
  ids = [t for s in sessions for t in s.get("collected") or []]
  summary = pytest_summary(res.output) if task.layout == LAYOUT_TB1 and not sessions else []
  if task.layout == LAYOUT_TB1 and ctrf is None and not problem:
    # parser_name: pytest — the counts of the verifier's own collection; S needs every test passed. A script
    # that runs no pytest at all (a gradle or cargo run that prints a pytest-style summary, as TB1's
    # adapters do) is read the way TB1's parser reads it (pytest_summary): the guard cannot vouch for it.
    tests = [{"name": t, "status": collected.get(t, "failed")} for t in ids] if sessions else summary
    ctrf = {"results": {"tool": {"name": "pytest"}, "summary": {}, "tests": tests}}
  out = verification_outcome(ctrf=ctrf, reward_text=reward, exit_code=res.exit_code,
                             hygiene_patterns=hygiene_patterns)
  if not problem and ctrf is not None and sessions and out.report is not None and out.report.valid:
    problem = report_problem({str(t.get("name")): t.get("status") for t in _ctrf_tests(ctrf)},
                             len(_ctrf_tests(ctrf)), ids, collected)
  r = out.terminal_reward
  if not problem and r is not None and not 0.0 <= r <= 1.0:
    problem = f"reward {r:g} outside [0, 1]"
  if not problem:  # what the environment lacked or broke (never scored), then TB1's parser
    passed = out.state == VerificationState.OK and out.success == 1 and (
        task.layout != LAYOUT_TB1 or 0 < out.total == out.passed)
    if network and not passed:
      return infra(NEEDS_NETWORK, f"the tests need the network, which the container does not have: {network}")
    if broken:
      return infra(VERIFIER_ERROR, f"{broken}; last output line: {_last_line(res.output)!r}")
    if (task.layout == LAYOUT_TB1 and not sessions and not summary and not _ctrf_tests(ctrf) and not passed
        and runner_missing(res.output, res.exit_code)):
      return infra(VERIFIER_ERROR, f"the test runner never ran (no pytest session, report or test summary; "
                                   f"exit {res.exit_code}): {_last_line(res.output)!r}")
    if task.layout == LAYOUT_TB1 and out.success == 1 and not passed:
      problem = f"parser pytest: {out.passed} of {out.total} tests passed"
  if problem:
    log.warning("%s: verification rejected: %s", task.name, problem)
    out = dataclasses.replace(out, state=VerificationState.INVALID_REPORT, success=0, reason=problem)
  return VerifierRun(out, res.output, res.exit_code, time.time() - t0)


# The site-packages of the interpreters of the given directories' prefixes ("<prefix>/bin" -> "<prefix>/lib/
# python3*/site-packages") and Debian's system dist-packages.
_PREPARE_SCRIPT = (
    f"/bin/rm -rf -- {' '.join(shlex.quote(p) for p in (LOGS_DIR, TESTS_DIR, GUARD_DIR, GUARD_LIB, *PLANTED_CONFIG))}"
    f" || exit 1\n/bin/mkdir -p -- {shlex.quote(LOGS_DIR)} {shlex.quote(GUARD_DIR)} || exit 1\n" + r"""
for d in "$@"; do
  [[ ${d##*/} == bin ]] || continue
  for s in "${d%/*}"/lib/python3*/site-packages; do [[ -d $s && ! -L $s ]] && echo "$s"; done
done
""" + f"[[ -d {SYSTEM_SITE} ]] && echo {SYSTEM_SITE}\nexit 0\n")

# What a name lookup or a connection says when the container has no network (curl, glibc / Python, Node, Java,
# Go, wget, apt-style "Could not resolve"): a host that does not resolve, or a network that cannot be reached
# (offline that means a non-loopback address). "Connection refused" is a server that is not there: the task's.
_NAME_FAILURE = re.compile(
    r"could not resolve host|temporary failure in name resolution|name or service not known|"
    r"no address associated with hostname|getaddrinfo (?:ENOTFOUND|EAI_AGAIN)|UnknownHostException|"
    r"\[Errno -[235]\]|unable to resolve host address|dial tcp: lookup \S+.*no such host", re.IGNORECASE)
_UNREACHABLE = re.compile(r"network is unreachable|\bENETUNREACH\b|\[Errno 101\]", re.IGNORECASE)
_LOOPBACK = re.compile(r"\blocalhost\b|\b127(?:\.\d{1,3}){3}\b|\[?::1\]?(?![\w:])|\b0\.0\.0\.0\b", re.IGNORECASE)
_SESSION_START = re.compile(r"^=+ test session starts =+$", re.MULTILINE)


def network_failure(output: str, ignore: tuple[str, ...] = ()) -> str:
  """The first line of a test script's output that shows a network failure (a name that does not resolve, an
  unreachable network to a non-loopback address), "" if none. Once a pytest session started, only its output
  counts (a setup step before it that failed offline, e.g. an installer the verifier satisfied from the image,
  did not fail the tests); lines naming a host in ``ignore`` do not count."""
  starts = [m.start() for m in _SESSION_START.finditer(output)]
  text = output[starts[0]:] if starts else output
  for line in text.splitlines():
    if ignore and any(h in line for h in ignore):
      continue
    if _NAME_FAILURE.search(line) or (_UNREACHABLE.search(line) and not _LOOPBACK.search(line)):
      line = " ".join(line.split())
      return line if len(line) <= 300 else line[:297] + "..."
  return ""


def _satisfied_hosts(task) -> tuple[str, ...]:
  """Hosts whose fetches the verifier satisfies from the image (the uv installer's)."""
  return ("astral.sh",) if uv_installer(task) is not None else ()


_PYTEST_USAGE = re.compile(r"^ERROR: (usage:|file or directory not found)|error: unrecognized arguments",
                           re.MULTILINE | re.IGNORECASE)


def runner_missing(output: str, exit_code: int | None) -> bool:
  """Whether a script's test runner never started: the shell could not find or run it (exit status 127 / 126,
  or "command not found"), or pytest refused its arguments before any session."""
  return exit_code in (126, 127) or "command not found" in output or bool(_PYTEST_USAGE.search(output))


def _last_line(output: str) -> str:
  lines = [x.strip() for x in output.splitlines() if x.strip()]
  line = lines[-1] if lines else ""
  return line if len(line) <= 300 else line[:297] + "..."


_SHORT_SUMMARY = re.compile(r"=+\s*short test summary info\s*=+", re.IGNORECASE)
_PASSING, _FAILING = ("PASSED", "XFAIL", "SKIPPED"), ("FAILED", "ERROR", "XPASS")


def pytest_summary(output: str) -> list[dict]:
  """TB1's pytest parser on a script's output: the ``STATUS name`` lines after pytest's "short test summary
  info" header (``-rA``), a test's last line winning; PASSED, XFAIL and SKIPPED pass, FAILED, ERROR and
  XPASS fail. [] without that header."""
  parts = _SHORT_SUMMARY.split(output, maxsplit=1)
  tests: dict[str, str] = {}
  for line in parts[1].splitlines() if len(parts) == 2 else []:
    if line.startswith("FAILED"):
      line = line.split(" - ")[0]
    words = line.split(maxsplit=1)
    status = words[0].strip().strip(":") if words else ""
    if len(words) == 2 and status in _PASSING + _FAILING:
      name = words[1].strip().split("::", 1)[-1]
      if name:
        tests[name] = "passed" if status in _PASSING else "failed"
  return [{"name": k, "status": v} for k, v in tests.items()]


def _guard_sessions(sandbox) -> list[dict]:
  """The guard's session records (parsed; an unreadable one is kept as {} and rejected later)."""
  try:
    stream, _ = sandbox.container.get_archive(GUARD_DIR)
  except Exception:  # noqa: BLE001 - the folder is gone (the script removed /logs): no pytest session record
    return []
  out = []
  with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
    for m in tar.getmembers():
      if m.isfile() and m.name.endswith(".json"):
        try:
          out.append(json.loads(tar.extractfile(m).read(16 << 20)))
        except (ValueError, UnicodeDecodeError):
          out.append({})
  return out


def session_problem(sessions: list[dict], nonce: str) -> str:
  """Why the guard's records cannot be trusted ("" if they can): a record the verifier did not start (wrong
  nonce), or a session that did not finish normally (pytest exit status 0 or 1; a usage or internal error,
  3 or 4, is the verifier's own: :func:`session_error`)."""
  for s in sessions:
    if not isinstance(s, dict) or s.get("nonce") != nonce:
      return "a pytest session record the verifier did not start"
  for s in sessions:
    if not s.get("finished"):
      return f"a pytest session (pid {s.get('pid')}) did not finish: the process ended inside the tests"
    if s.get("exitstatus") not in NORMAL_EXIT + ENV_EXIT:
      return f"a pytest session ended with exit status {s.get('exitstatus')} (not a normal finish)"
  return ""


def session_error(sessions: list[dict]) -> str:
  """A pytest session of the verifier's that ended with an internal error (exit status 3) or a usage error
  (4: a test file or folder not found, bad arguments): the environment's fault, not the agent's ("" if
  none)."""
  for s in sessions:
    status = s.get("exitstatus")
    if status in ENV_EXIT:
      what = "a usage error" if status == 4 else "an internal error"
      return f"a pytest session (pid {s.get('pid')}) ended with {what} (exit status {status})"
  return ""


def report_problem(report: dict, n_entries: int, collected: list, outcomes: dict) -> str:
  """A report must name exactly the tests the verifier's own collection holds, each once, and may not
  call a test passed that the collection saw fail ("" if it does neither)."""
  extra = sorted(set(report) - set(collected))
  if extra:
    return f"the report names tests the verifier did not collect: {extra[:3]}"
  missing = sorted(set(collected) - set(report))
  if missing:
    return f"the report leaves out {len(missing)} collected test(s): {missing[:3]}"
  if n_entries != len(report):
    return "the report names a test twice"
  forged = sorted(t for t, st in report.items() if st == "passed" and outcomes.get(t, "failed") != "passed")
  if forged:
    return f"the report calls {len(forged)} test(s) passed that did not pass: {forged[:3]}"
  return ""


def _ctrf_tests(ctrf) -> list[dict]:
  data = ctrf
  if isinstance(ctrf, (bytes, bytearray, str)):
    try:
      data = json.loads(ctrf)
    except ValueError:
      return []
  tests = ((data or {}).get("results") or {}).get("tests") or []
  return [t for t in tests if isinstance(t, dict)]
