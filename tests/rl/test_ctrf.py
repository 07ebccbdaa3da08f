"""CTRF verification reports: real `pytest --ctrf` output, the CTRF spec form, broken files, the terminal gate."""

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

from rsi_jax.rl.ctrf import (CTRFReport, VerificationState, compile_hygiene_patterns, read_verifier_dir,
                             terminal_success, verification_outcome)
from rsi_jax.rl.rewards import parse_ctrf

HYGIENE = (r"::test_hygiene_",)

# A verifier-like test file. Expected outcome of every case (pytest-json-ctrf 0.6.1, the pinned version,
# reports each parametrized case separately, xfail as skipped, xpass as passed, setup errors as failed):
VERIFIER_TESTS = textwrap.dedent('''
    import os
    import pytest

    @pytest.mark.parametrize("x", [1, 2, 3, 4])
    def test_param(x):                 # 3 passed, 1 failed
        assert x != 3

    @pytest.mark.xfail(reason="known")
    def test_xfail():                  # skipped
        assert False

    @pytest.mark.xfail(reason="flaky")
    def test_xpass():                  # passed (non-strict xpass)
        assert True

    @pytest.mark.skip(reason="not here")
    def test_skip():                   # skipped
        pass

    @pytest.mark.skipif(True, reason="never")
    def test_skipif():                 # skipped
        pass

    class TestOutputs:
        def test_file(self):           # passed
            assert True

        def test_content(self):        # failed
            assert "a" == "b"

        def test_hygiene_no_tmp_left(self):    # hygiene, passed
            assert True

    def test_hygiene_tests_untouched():        # hygiene, failed
        assert False

    @pytest.fixture
    def broken():
        raise RuntimeError("setup")

    def test_setup_error(broken):      # failed (setup error)
        pass
''')
# non-hygiene: passed 3 + 1 (xpass) + 1 (TestOutputs.test_file) = 5; failed 1 + 1 + 1 = 3; skipped 3
EXPECTED = dict(passed=5, failed=3, skipped=3, other=0, hygiene_passed=1, hygiene_total=2)


def run_pytest_ctrf(tmp_path, files: dict, *extra):
  """Run `python -m pytest --ctrf` on test files written into tmp_path; returns (ctrf path, exit code)."""
  for name, text in files.items():
    (tmp_path / name).write_text(text)
  (tmp_path / "pytest.ini").write_text("[pytest]\n")  # keep this repository's pytest config out
  out = tmp_path / "logs" / "ctrf.json"
  # Load only the CTRF plugin (found through its pytest11 entry point): autoloading every installed plugin
  # costs ~2 s per run here and changes nothing in the report.
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
  env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
  (plugin,) = importlib.metadata.entry_points(group="pytest11", name="ctrf")
  cmd = [sys.executable, "-m", "pytest", "-p", plugin.value, "--ctrf", str(out), "-p", "no:cacheprovider", "-q",
         *extra, *files]
  proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
  return out, proc.returncode, proc.stdout + proc.stderr


def junit_counts(path, hygiene_word="hygiene"):
  """Independent reference: the same run's JUnit XML, counted the way CTRF should count it."""
  counts = dict.fromkeys(("passed", "failed", "skipped", "hygiene_total", "hygiene_passed"), 0)
  for case in ET.parse(path).getroot().iter("testcase"):
    kids = {c.tag for c in case}
    status = ("failed" if kids & {"failure", "error"} else "skipped" if "skipped" in kids else "passed")
    if hygiene_word in case.get("name"):
      counts["hygiene_total"] += 1
      counts["hygiene_passed"] += status == "passed"
    else:
      counts[status] += 1
  return counts


def test_real_pytest_ctrf_counts(tmp_path):
  junit = tmp_path / "junit.xml"
  ctrf, rc, log = run_pytest_ctrf(tmp_path, {"test_outputs.py": VERIFIER_TESTS}, f"--junitxml={junit}")
  assert rc == 1, log
  report = parse_ctrf(ctrf, HYGIENE)
  assert report.valid, report.reason
  got = {k: getattr(report, k) for k in EXPECTED}
  assert got == EXPECTED
  assert report.total == 11
  ref = junit_counts(junit)
  assert {k: got[k] for k in ref} == ref
  # The same report without hygiene patterns counts the hygiene checks as ordinary checks.
  plain = parse_ctrf(ctrf)
  assert (plain.passed, plain.failed, plain.total) == (6, 4, 13)
  # Loaded dict and JSON text give the same report as the path.
  assert parse_ctrf(json.loads(ctrf.read_text()), HYGIENE) == report
  assert parse_ctrf(ctrf.read_text(), HYGIENE) == report
  assert parse_ctrf(ctrf.read_bytes(), HYGIENE) == report


def test_real_pytest_ctrf_collection_error_is_invalid(tmp_path):
  files = {"test_broken.py": "import module_that_does_not_exist\n\ndef test_x():\n    pass\n",
           "test_fine.py": "def test_ok():\n    assert True\n"}
  ctrf, rc, log = run_pytest_ctrf(tmp_path, files)
  assert rc == 2, log  # pytest: interrupted by a collection error
  report = parse_ctrf(ctrf)
  assert not report.valid
  assert "0 tests" in report.reason
  out = verification_outcome(ctrf, reward_text=None, exit_code=rc)
  assert out.state is VerificationState.INVALID_REPORT
  assert out.success == 0 and out.trainable and not out.report_valid
  assert (out.passed, out.total) == (0, 0)
  assert "0 tests" in out.reason


def test_real_pytest_ctrf_all_pass_through_verifier_dir(tmp_path):
  ctrf, rc, log = run_pytest_ctrf(tmp_path, {"test_ok.py": "def test_a():\n  pass\n\ndef test_b():\n  pass\n"})
  assert rc == 0, log
  (ctrf.parent / "reward.txt").write_text("1\n")
  out = read_verifier_dir(ctrf.parent, exit_code=rc)
  assert out.state is VerificationState.OK and out.success == 1
  assert (out.passed, out.total) == (2, 2)
  assert out.terminal_reward == 1.0


# ------------------------------------------------------------------------------------- hand-written forms

# The CTRF specification's form: camelCase keys, integer milliseconds, reportFormat / specVersion.
SPEC_FORM = {
    "reportFormat": "CTRF", "specVersion": "0.0.0",
    "results": {
        "tool": {"name": "jest"},
        "summary": {"tests": 6, "passed": 2, "failed": 1, "pending": 1, "skipped": 1, "other": 1,
                    "start": 1706828654274, "stop": 1706828655782},
        "tests": [
            {"name": "user can log in", "status": "passed", "duration": 1200, "rawStatus": "passed"},
            {"name": "profile shows email", "status": "failed", "duration": 800, "filePath": "a.test.ts",
             "message": "expected x", "trace": "at line 3"},
            {"name": "user can log out", "status": "skipped", "duration": 0},
            {"name": "settings persist", "status": "pending", "duration": 0},
            {"name": "flaky retry", "status": "passed", "duration": 20, "retries": 2, "flaky": True},
            {"name": "weird", "status": "other", "duration": 1},
        ],
    },
}

# Older pytest-json-ctrf releases: snake_case keys, no reportFormat, parametrized cases collapsed into one
# entry; this is what the terminal-bench style `pytest --ctrf` in many task images writes.
SNAKE_FORM = {
    "results": {
        "tool": {"name": "pytest", "version": "8.4.1"},
        "summary": {"tests": 5, "passed": 3, "failed": 1, "skipped": 1, "pending": 0, "other": 0,
                    "start": 1752000000.123, "stop": 1752000001.456},
        "tests": [
            {"name": "test_outputs.py::test_param", "status": "passed", "duration": 0.0012,
             "start": 1752000000.2, "stop": 1752000000.3, "retries": 3, "file_path": "test_outputs.py"},
            {"name": "test_outputs.py::test_file", "status": "passed", "duration": 0.5,
             "file_path": "test_outputs.py"},
            {"name": "test_outputs.py::test_content", "status": "failed", "raw_status": "call_failed",
             "duration": 0.01, "file_path": "test_outputs.py", "trace": "AssertionError"},
            {"name": "test_outputs.py::test_xfail", "status": "skipped", "duration": 0.0},
            {"name": "test_outputs.py::test_hygiene_no_tmp", "status": "passed", "duration": 0.1},
        ],
    },
}


def test_spec_form_camel_case():
  r = parse_ctrf(SPEC_FORM)
  assert r.valid and r.dialect == "camelCase"
  assert (r.passed, r.failed, r.skipped, r.other, r.total) == (2, 1, 2, 1, 6)
  assert r.warnings == ()
  r2 = parse_ctrf(SPEC_FORM, [r"^profile", r"log (in|out)$"])
  assert (r2.passed, r2.failed, r2.total, r2.hygiene_total, r2.hygiene_passed) == (1, 0, 3, 3, 1)


def test_snake_case_form(tmp_path):
  p = tmp_path / "ctrf.json"
  p.write_text(json.dumps(SNAKE_FORM, indent=4))
  r = parse_ctrf(p, HYGIENE)
  assert r.valid and r.dialect == "snake_case"
  assert (r.passed, r.failed, r.skipped, r.total, r.hygiene_total) == (2, 1, 1, 4, 1)


def test_unknown_status_counts_as_other_with_warning():
  data = {"results": {"tests": [{"name": "a", "status": "passed"}, {"name": "b", "status": "broken"}],
                      "summary": {"tests": 3}}}
  r = parse_ctrf(data)
  assert r.valid and (r.passed, r.other, r.total) == (1, 1, 2)
  assert any("broken" in w for w in r.warnings)
  assert any("summary.tests = 3" in w for w in r.warnings)


@pytest.mark.parametrize("content, reason", [
    ("", "is empty"),
    ("   \n", "is empty"),
    ('{"results": {"tests": [', "not valid JSON"),
    ("[1, 2]", "top level must be an object"),
    ('{"reportFormat": "JUnit", "results": {"tests": []}}', "reportFormat"),
    ('{"summary": {}}', "no 'results' object"),
    ('{"results": {"summary": {"tests": 3}}}', "no 'results.tests' list"),
    ('{"results": {"tests": {"a": 1}}}', "no 'results.tests' list"),
    ('{"results": {"tests": [{"name": "a", "status": "passed"}, 7]}}', "results.tests[1] is not an object"),
    ('{"results": {"tests": [{"status": "passed"}]}}', "no string 'name'"),
    ('{"results": {"tests": [{"name": "t"}]}}', "no string 'status'"),
    ('{"results": {"tests": []}}', "0 tests"),
    ('{"results": {"tests": [{"name": "x::test_hygiene_a", "status": "passed"}]}}', "all 1 tests are hygiene"),
])
def test_broken_files_are_invalid_with_reason(tmp_path, content, reason):
  p = tmp_path / "ctrf.json"
  p.write_text(content)
  r = parse_ctrf(p, HYGIENE)
  assert not r.valid
  assert reason in r.reason, r.reason


def test_missing_and_unreadable_sources(tmp_path):
  assert "does not exist" in parse_ctrf(tmp_path / "nope.json").reason
  assert "is a directory" in parse_ctrf(tmp_path).reason
  assert "missing" in parse_ctrf(None).reason
  assert "unsupported" in parse_ctrf(12).reason
  assert "top level must be an object" in parse_ctrf("  [1]").reason
  assert not CTRFReport.invalid("x").valid


def test_bad_hygiene_regex_raises():
  with pytest.raises(ValueError, match="not a valid regex"):
    parse_ctrf(SPEC_FORM, ["("])
  assert compile_hygiene_patterns("a")[0].pattern == "a"
  assert compile_hygiene_patterns(None) == ()


# ------------------------------------------------------------------------------------------ terminal gate


@pytest.mark.parametrize("text, exit_code, expected", [
    ("1", None, (1, 1.0)),
    ("1.0\n", 1, (1, 1.0)),  # reward.txt wins over the exit status
    ("0", 0, (0, 0.0)),
    ("0.95", None, (0, 0.95)),  # near-completion is not success: S = 1{r >= 1}
    ("2", None, (1, 2.0)),
    (b"1", None, (1, 1.0)),
    ("garbage", 0, (1, None)),  # unreadable reward.txt: fall back to the exit status
    ("nan", 3, (0, None)),
    (None, 0, (1, None)),
    (None, 1, (0, None)),
    (None, None, (None, None)),
    ("", None, (None, None)),
])
def test_terminal_success(text, exit_code, expected):
  s, r, _ = terminal_success(text, exit_code)
  assert (s, r) == expected


def test_verification_outcome_states(tmp_path):
  ok = verification_outcome(SPEC_FORM, "1")
  assert ok.state is VerificationState.OK and ok.report_valid and ok.trainable
  assert (ok.success, ok.passed, ok.total, ok.reason) == (1, 2, 6, "")

  inv = verification_outcome("{not json", "0")
  assert inv.state is VerificationState.INVALID_REPORT and inv.success == 0 and inv.trainable
  assert "not valid JSON" in inv.reason

  infra = verification_outcome(SPEC_FORM, "1", 0, infra_error="verifier timed out after 300 s")
  assert infra.state is VerificationState.INFRA_FAILURE and infra.success is None and not infra.trainable
  assert "timed out" in infra.reason

  nogate = verification_outcome(SPEC_FORM, None, None)
  assert nogate.state is VerificationState.INFRA_FAILURE and "terminal gate unavailable" in nogate.reason

  d = ok.to_dict()
  assert d["state"] == "ok" and d["valid"] is True and d["passed"] == 2

  # A verifier folder without ctrf.json: invalid report, reward falls back to S from reward.txt.
  (tmp_path / "reward.txt").write_text("1")
  out = read_verifier_dir(tmp_path)
  assert out.state is VerificationState.INVALID_REPORT and out.success == 1
  assert "does not exist" in out.reason
