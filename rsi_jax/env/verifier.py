"""Protected verification: run a task's tests only after the agent has finished (SPEC §6, paper §2.2).

Order of operations in the episode's container, once the agent's last command has returned:

1. stop every process the agent left behind (``kill -KILL -1``; PID 1 is exempt), so nothing can write
   into ``/logs/verifier`` or ``/tests`` while the verifier runs;
2. look for tampering with the tools the verifier runs on (``docker diff``: changed or deleted programs, the
   Python interpreter, its library and site-packages, pytest, the dynamic loader and shared libraries, and a
   new program in a bin directory that shadows one of the same name elsewhere on the verifier's PATH);
   tampering fails the episode (S = 0). Parent-directory entries of ``docker diff`` and byte-code are not
   tampering (an agent that ran Python or its own pytest and then solved the task is not punished), but
   byte-code the agent added or changed in those trees is deleted before the tests run;
3. delete ``/logs/verifier``, ``/tests`` and pytest configuration files planted at ``/`` (with tools named
   by absolute path), then copy the task's tests to ``/tests`` (they were never in the container before)
   and the pytest guard (:mod:`rsi_jax.env.pytest_guard`);
4. run the test script with a fixed environment (no agent variables, a PATH with the system directories
   first, no user site-packages, the working directory never on Python's path (``PYTHONSAFEPATH``), on-disk
   byte-code ignored (a fresh ``PYTHONPYCACHEPREFIX``), the guard loaded into every pytest session, and, in a
   container without a network, apt fetches not retried: :data:`APT_OFFLINE_CONF`) under the verifier
   timeout, its whole process group killed at the timeout;
5. read ``/logs/verifier/ctrf.json``, the terminal gate (``reward.txt``; Terminal-Bench 1: the script's exit
   status and ``parser_name: pytest`` — every collected test passed) and the guard's session records into a
   :class:`rsi_jax.rl.ctrf.VerificationOutcome`. A pytest session that started but did not finish normally
   (a module under test that wrote a report and exited), a report naming tests the verifier did not
   collect or leaving collected ones out, a session record the verifier did not start, or a reward outside
   [0, 1] make the report invalid and S = 0.

A verifier that times out, a container that dies, or a Docker error is an infrastructure failure: neither
success nor failure (masked out of training and counted).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import re
import secrets
import tarfile
import time
from pathlib import Path

from rsi_jax.env.sandbox import (CONTAINER_DIED, VERIFIER_ERROR, VERIFIER_TIMEOUT, DockerSandbox,
                                 SandboxError)
from rsi_jax.env.tasks import LAYOUT_TB1, Task
from rsi_jax.env.verifier_deps import OFFLINE_ENV, uv_installer, uv_preseed_script
from rsi_jax.rl.ctrf import VerificationOutcome, VerificationState, verification_outcome

log = logging.getLogger(__name__)

LOGS_DIR = "/logs/verifier"
TESTS_DIR = "/tests"
# pytest picks these up from the ancestors of /tests, i.e. from "/".
PLANTED_CONFIG = ("/conftest.py", "/pytest.ini", "/tox.ini", "/setup.cfg", "/pyproject.toml")

# The verifier's PATH: system directories first, so nothing added to /usr/local/bin shadows a system tool.
VERIFIER_PATH = "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"
# The pytest guard: its records, its module (on PYTHONPATH, and in the system interpreter's dist-packages
# for scripts that run Python isolated) and how pytest loads it (PYTEST_PLUGINS survives a script's
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

# What the verifier's own execution depends on; any change here (added, changed or deleted) is tampering:
# the interpreter and anything named like it or like pytest, the Python library and site-packages trees
# (sitecustomize and .pth files included; Debian keeps sitecustomize under /etc/python3.*), the dynamic
# loader and shared libraries, and the merged-/usr symlinks at the root.
_PROTECTED_ANY = re.compile(
    r"^/(usr/)?(local/)?s?bin/(python[0-9.]*(-config)?|pytest[-0-9.]*|py\.test[-0-9.]*)$"
    r"|^/usr/(local/)?lib/python3[^/]*(/.*)?$"
    r"|^/etc/python3[^/]*(/.*)?$"
    r"|^/etc/ld\.so\.(preload|conf)"
    r"|^/(usr/)?lib(64)?/(x86_64-linux-gnu/)?(ld-linux|lib[^/]*\.so)"
    r"|^/(bin|sbin|lib|lib64)$"
    r"|^/opt/rsi-verifier-[^/]+(/.*)?$"  # what the build fetched for the verifier (verifier_deps)
    r"|^/root/\.local/share/uv(/.*)?$")  # Python versions uv installed at build time for the verifier
# Existing programs may not be changed or deleted (new ones may be added: tasks install tools). root's
# ~/.local/bin counts too: a verifier script that sources uv's env file puts it first on its PATH.
_PROGRAM_DIRS = re.compile(r"^(/(usr/)?(local/)?s?bin|/root/\.local/bin)/[^/]+$")
KIND_MODIFIED, KIND_ADDED, KIND_DELETED = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class VerifierRun:
  """What one protected verification produced."""
  outcome: VerificationOutcome
  output: str  # the test script's output (capped)
  exit_code: int | None
  duration_s: float
  failure_kind: str = ""  # "" or a sandbox failure kind when the outcome is an infrastructure failure
  tampered: tuple[str, ...] = ()


def tampered_paths(changed) -> list[str]:
  """The changes (``docker diff``: [{"Path": p, "Kind": 0 modified | 1 added | 2 deleted}] or bare paths,
  taken as modified) that touch what the verifier runs on. Byte-code is ignored (Python writes it itself
  when an agent merely imports a module, and the verifier never reads it: a fresh pycache prefix), and so is
  a "modified" entry for a directory that only holds other changes (``docker diff`` lists the parents of
  every change)."""
  entries = [(c, KIND_MODIFIED) if isinstance(c, str) else (c["Path"], c.get("Kind", KIND_MODIFIED))
             for c in changed]
  parents = {p.rsplit("/", 1)[0] or "/" for p, _ in entries}
  parents |= {q for p in list(parents) for q in _ancestors(p)}
  out = []
  for path, kind in entries:
    if "/__pycache__" in path or path.endswith((".pyc", ".pyo")):
      continue
    if kind == KIND_MODIFIED and path in parents:
      continue
    if _PROTECTED_ANY.match(path) or (_PROGRAM_DIRS.match(path) and kind != KIND_ADDED):
      out.append(path)
  return out


def agent_bytecode(changed) -> list[str]:
  """Byte-code the agent added or changed inside what the verifier runs on (``docker diff`` entries under the
  protected trees: the interpreter's library, site-packages, the verifier's fetched tools). A test script that
  runs Python in isolated mode (``-I``) ignores the verifier's fresh pycache prefix and would load it in place
  of the source; the verifier deletes it first (Python falls back to the source, so nothing legitimate is
  lost)."""
  out = []
  for c in changed:
    path, kind = (c, KIND_MODIFIED) if isinstance(c, str) else (c["Path"], c.get("Kind", KIND_MODIFIED))
    if kind == KIND_DELETED or not _PROTECTED_ANY.match(path):
      continue
    if path.endswith((".pyc", ".pyo")) or (kind == KIND_ADDED and path.endswith("/__pycache__")):
      out.append(path)
  return out


def _ancestors(path: str) -> list[str]:
  parts = path.strip("/").split("/")
  return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


# Bash builtins only (nothing on the agent's PATH runs): for each added program, is there another program of
# the same name in another directory of the verifier's PATH (directories compared by their real path)?
_SHADOW_SCRIPT = r"""
for p in "$@"; do
  name=${p##*/}; here=$(cd -P "${p%/*}" 2>/dev/null && pwd -P)
  IFS=: read -ra dirs <<< "$VERIFIER_PATH"
  for d in "${dirs[@]}"; do
    real=$(cd -P "$d" 2>/dev/null && pwd -P) || continue
    if [[ "$real" != "$here" && -e "$d/$name" ]]; then echo "$p"; break; fi
  done
done
"""


def shadowing_programs(sandbox: DockerSandbox, changed) -> list[str]:
  """New programs in a bin directory that shadow a program of the same name elsewhere on the verifier's
  PATH (e.g. ``/usr/local/bin/mkdir`` or ``/usr/sbin/diff``)."""
  added = [c["Path"] for c in changed if not isinstance(c, str) and c.get("Kind") == KIND_ADDED
           and _PROGRAM_DIRS.match(c["Path"])]
  if not added:
    return []
  res = sandbox.exec_raw(["/bin/bash", "-c", _SHADOW_SCRIPT, "shadow", *added], timeout_s=30,
                         env={"VERIFIER_PATH": VERIFIER_PATH})
  return [x for x in res.output.splitlines() if x in added]


def verify(sandbox: DockerSandbox, task: Task, *, timeout_s: float | None = None,
           hygiene_patterns=(), output_cap_bytes: int = 20_000) -> VerifierRun:
  """Run the task's protected verifier in ``sandbox`` (after the agent finished). Never raises for
  sandbox problems: they become an infrastructure-failure outcome with ``failure_kind`` set."""
  timeout_s = float(timeout_s or task.verifier_timeout_s)
  t0 = time.time()
  try:
    return _verify(sandbox, task, timeout_s, hygiene_patterns, output_cap_bytes, t0)
  except SandboxError as e:
    out = verification_outcome(infra_error=str(e))
    return VerifierRun(out, "", None, time.time() - t0, failure_kind=e.kind)


def _verify(sandbox, task, timeout_s, hygiene_patterns, cap, t0) -> VerifierRun:
  # 1. Nothing the agent started may outlive its turn.
  sandbox.exec_raw(["kill", "-KILL", "-1"], timeout_s=30)
  # 2. Tampering with the verifier's tools fails the episode.
  changes = sandbox.changes()
  bad = tampered_paths(changes)
  bad += [p for p in shadowing_programs(sandbox, changes) if p not in bad]
  if bad:
    log.warning("%s: verifier tools changed by the agent: %s", task.name, bad[:5])
    out = verification_outcome(reward_text="0", exit_code=1)
    out = dataclasses.replace(out, state=VerificationState.INVALID_REPORT,
                              reason=f"verifier tools tampered with: {', '.join(bad[:5])}")
    return VerifierRun(out, "", None, time.time() - t0, tampered=tuple(bad))
  # 3. A clean slate: no pre-written report, no planted tests or pytest configuration, no byte-code of the
  # agent's in the verifier's own trees.
  stale = agent_bytecode(changes)
  for i in range(0, len(stale), 500):
    rm = sandbox.exec_raw(["/bin/rm", "-rf", "--", *stale[i:i + 500]], timeout_s=60)
    if rm.exit_code != 0:
      raise SandboxError(VERIFIER_ERROR, f"could not remove the agent's byte-code: {rm.output[-300:]}")
  nonce = secrets.token_hex(16)
  clean = sandbox.exec_raw(["/bin/rm", "-rf", LOGS_DIR, TESTS_DIR, GUARD_DIR, GUARD_LIB, *PLANTED_CONFIG],
                           timeout_s=30)
  if clean.exit_code != 0:
    raise SandboxError(VERIFIER_ERROR, f"could not clear {LOGS_DIR}: {clean.output[-300:]}")
  sandbox.exec_raw(["/bin/mkdir", "-p", LOGS_DIR, GUARD_DIR], timeout_s=30)
  sandbox.put_dir(task.tests_dir, TESTS_DIR, extra=task.extra_test_files)
  guard = {f"{GUARD_LIB}/{GUARD_MODULE}.py": GUARD_SOURCE.read_bytes()}
  if sandbox.exec_raw(["/bin/bash", "-c", f"[[ -d {SYSTEM_SITE} ]]"], timeout_s=30).exit_code == 0:
    guard[f"{SYSTEM_SITE}/{GUARD_MODULE}.py"] = guard[f"{GUARD_LIB}/{GUARD_MODULE}.py"]
  offline = sandbox.network == "none"
  if offline:
    guard[APT_OFFLINE_CONF] = APT_OFFLINE
  sandbox.put_files(guard)
  # 4. The test script, with a fixed environment.
  env = {**task.verifier_env, "PATH": task.verifier_env.get("PATH", VERIFIER_PATH), "TEST_DIR": TESTS_DIR, "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
         "PYTHONSAFEPATH": "1", "PYTHONPYCACHEPREFIX": f"/tmp/.rsi-pycache-{nonce}", "PYTHONPATH": GUARD_LIB,
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
  if task.layout != LAYOUT_TB1 and reward is None:
    # Harbor's verifier must write reward.txt; without it the verifier itself broke.
    out = verification_outcome(infra_error=f"verifier wrote no reward.txt (exit {res.exit_code})")
    return VerifierRun(out, res.output, res.exit_code, time.time() - t0, failure_kind=VERIFIER_ERROR)
  sessions = _guard_sessions(sandbox)
  problem = session_problem(sessions, nonce)
  collected = {t: o for s in sessions for t, o in (s.get("outcomes") or {}).items()}
  ids = [t for s in sessions for t in s.get("collected") or []]
  if task.layout == LAYOUT_TB1 and ctrf is None and not problem:
    # parser_name: pytest — the counts of the verifier's own collection; S needs every test passed. A script
    # that runs no pytest at all (a gradle or cargo run that prints a pytest-style summary, as TB1's
    # adapters do) is read the way TB1's parser reads it (pytest_summary): the guard cannot vouch for it.
    tests = ([{"name": t, "status": collected.get(t, "failed")} for t in ids] if sessions
             else pytest_summary(res.output))
    ctrf = {"results": {"tool": {"name": "pytest"}, "summary": {}, "tests": tests}}
  out = verification_outcome(ctrf=ctrf, reward_text=reward, exit_code=res.exit_code,
                             hygiene_patterns=hygiene_patterns)
  if not problem and ctrf is not None and sessions and out.report is not None and out.report.valid:
    problem = report_problem({str(t.get("name")): t.get("status") for t in _ctrf_tests(ctrf)},
                             len(_ctrf_tests(ctrf)), ids, collected)
  r = out.terminal_reward
  if not problem and r is not None and not 0.0 <= r <= 1.0:
    problem = f"reward {r:g} outside [0, 1]"
  if not problem and task.layout == LAYOUT_TB1 and out.success == 1 and (out.total == 0 or out.passed < out.total):
    problem = f"parser pytest: {out.passed} of {out.total} tests passed"
  if problem:
    log.warning("%s: verification rejected: %s", task.name, problem)
    out = dataclasses.replace(out, state=VerificationState.INVALID_REPORT, success=0, reason=problem)
  return VerifierRun(out, res.output, res.exit_code, time.time() - t0)


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
  nonce), or a session that did not finish normally (pytest exit status 0 or 1)."""
  for s in sessions:
    if not isinstance(s, dict) or s.get("nonce") != nonce:
      return "a pytest session record the verifier did not start"
    if not s.get("finished"):
      return f"a pytest session (pid {s.get('pid')}) did not finish: the process ended inside the tests"
    if s.get("exitstatus") not in NORMAL_EXIT:
      return f"a pytest session ended with exit status {s.get('exitstatus')} (not a normal finish)"
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
