"""Protected verification: run a task's tests only after the agent has finished (SPEC §6, paper §2.2).

Order of operations in the episode's container, once the agent's last command has returned:

1. stop every process the agent left behind (``kill -KILL -1``; PID 1 is exempt), so nothing can write
   into ``/logs/verifier`` or ``/tests`` while the verifier runs;
2. look for tampering with the tools the verifier runs on (``docker diff``: changed or deleted programs, the
   Python interpreter, its library and site-packages, pytest, the dynamic loader and shared libraries);
   tampering fails the episode (S = 0);
3. delete ``/logs/verifier``, ``/tests`` and pytest configuration files planted at ``/``, then copy the
   task's tests to ``/tests`` (they were never in the container before);
4. run the test script with a fixed environment (no agent variables, a PATH with the system directories
   first, no user site-packages) under the verifier timeout, its whole process group killed at the timeout;
5. read ``/logs/verifier/ctrf.json`` and the terminal gate (``reward.txt``, or the script's exit status for
   Terminal-Bench 1 tasks) into a :class:`rsi_jax.rl.ctrf.VerificationOutcome`.

A verifier that times out, a container that dies, or a Docker error is an infrastructure failure: neither
success nor failure (masked out of training and counted).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time

from rsi_jax.env.sandbox import (CONTAINER_DIED, VERIFIER_ERROR, VERIFIER_TIMEOUT, DockerSandbox,
                                 SandboxError)
from rsi_jax.env.tasks import LAYOUT_TB1, Task
from rsi_jax.rl.ctrf import VerificationOutcome, VerificationState, verification_outcome

log = logging.getLogger(__name__)

LOGS_DIR = "/logs/verifier"
TESTS_DIR = "/tests"
# pytest picks these up from the ancestors of /tests, i.e. from "/".
PLANTED_CONFIG = ("/conftest.py", "/pytest.ini", "/tox.ini", "/setup.cfg", "/pyproject.toml")

# The verifier's PATH: system directories first, so nothing added to /usr/local/bin shadows a system tool.
VERIFIER_PATH = "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"

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
    r"|^/(bin|sbin|lib|lib64)$")
# Existing programs may not be changed or deleted (new ones may be added: tasks install tools).
_PROGRAM_DIRS = re.compile(r"^/(usr/)?(local/)?s?bin/[^/]+$")
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
  taken as modified) that touch what the verifier runs on. Byte-code caches are ignored: Python writes them
  itself when an agent merely imports a module."""
  out = []
  for c in changed:
    path, kind = (c, KIND_MODIFIED) if isinstance(c, str) else (c["Path"], c.get("Kind", KIND_MODIFIED))
    if "/__pycache__" in path:
      continue
    if _PROTECTED_ANY.match(path) or (_PROGRAM_DIRS.match(path) and kind != KIND_ADDED):
      out.append(path)
  return out


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
  bad = tampered_paths(sandbox.changes())
  if bad:
    log.warning("%s: verifier tools changed by the agent: %s", task.name, bad[:5])
    out = verification_outcome(reward_text="0", exit_code=1)
    out = dataclasses.replace(out, state=VerificationState.INVALID_REPORT,
                              reason=f"verifier tools tampered with: {', '.join(bad[:5])}")
    return VerifierRun(out, "", None, time.time() - t0, tampered=tuple(bad))
  # 3. A clean slate: no pre-written report, no planted tests or pytest configuration.
  clean = sandbox.exec_raw(["rm", "-rf", LOGS_DIR, TESTS_DIR, *PLANTED_CONFIG], timeout_s=30)
  if clean.exit_code != 0:
    raise SandboxError(VERIFIER_ERROR, f"could not clear {LOGS_DIR}: {clean.output[-300:]}")
  sandbox.exec_raw(["mkdir", "-p", LOGS_DIR], timeout_s=30)
  sandbox.put_dir(task.tests_dir, TESTS_DIR, extra=task.extra_test_files)
  # 4. The test script, with a fixed environment.
  env = {"PATH": VERIFIER_PATH, "TEST_DIR": TESTS_DIR, "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
  if task.layout == LAYOUT_TB1:
    # Terminal-Bench 1 scripts run pytest without a report file; ask pytest-json-ctrf for one.
    env["PYTEST_ADDOPTS"] = f"--ctrf {LOGS_DIR}/ctrf.json"
  workdir = (sandbox.container.attrs.get("Config") or {}).get("WorkingDir") or "/"
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
  out = verification_outcome(ctrf=ctrf, reward_text=reward, exit_code=res.exit_code,
                             hygiene_patterns=hygiene_patterns)
  return VerifierRun(out, res.output, res.exit_code, time.time() - t0)
