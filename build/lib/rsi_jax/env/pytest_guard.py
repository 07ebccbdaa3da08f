"""rsi_pytest_guard: the verifier's own record of every pytest session a task's test script starts.

Copied into the container at verification time (never present while the agent runs) and loaded into each
pytest process with ``-p rsi_pytest_guard`` (``PYTEST_ADDOPTS``). For every session it writes
``$RSI_GUARD_DIR/<pid>.json``: a record when pytest is configured (before any test module — and so any of
the agent's code — is imported), then, at the end of the session, the collected test ids, each test's
outcome and pytest's exit status. The verifier (:mod:`rsi_jax.env.verifier`) trusts a report only when
every session it started finished normally, and counts N and the allowed test ids from this collection.

Self-contained (standard library only, Python >= 3.8): it runs under whatever interpreter the task uses.
"""

import json
import os

_NONCE = os.environ.pop("RSI_GUARD_NONCE", "")  # not visible to the tests' subprocesses
_DIR = os.environ.get("RSI_GUARD_DIR", "")
_state = {"collected": [], "outcomes": {}}


def _write(record):
  if not (_NONCE and _DIR):
    return
  path = os.path.join(_DIR, "%d.json" % os.getpid())
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(dict(record, nonce=_NONCE, pid=os.getpid()), f)
  os.replace(tmp, path)


def pytest_configure(config):
  if getattr(config, "workerinput", None) is not None:  # an xdist worker: the controller records
    return
  _write({"finished": False})


def pytest_collection_finish(session):
  _state["collected"] = [item.nodeid for item in session.items]


def pytest_runtest_logreport(report):
  outcomes = _state["outcomes"]
  if report.when == "call":
    if hasattr(report, "wasxfail"):
      outcomes[report.nodeid] = "skipped"
    else:
      outcomes[report.nodeid] = report.outcome
  elif report.failed:  # an error in setup or teardown fails the test
    outcomes[report.nodeid] = "failed"
  elif report.when == "setup" and report.skipped:
    outcomes[report.nodeid] = "skipped"


def pytest_sessionfinish(session, exitstatus):
  if getattr(session.config, "workerinput", None) is not None:
    return
  _write({"finished": True, "exitstatus": int(exitstatus), "collected": _state["collected"],
          "outcomes": _state["outcomes"]})
