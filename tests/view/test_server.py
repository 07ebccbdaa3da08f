"""The run browser's server without a browser: a run folder that is still being written (no lineage yet, a
metrics line cut mid-write, a step file whose episode has no check report) serves every page; paths outside the
run folder are refused; the command line's usage errors are one line and exit status 2."""

import json
import threading
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest

from rsi_jax.env.harness import Turn
from rsi_jax.env.episode import EpisodeResult
from rsi_jax.env.transcripts import TranscriptWriter, episode_record
from rsi_jax.rl.ctrf import verification_outcome
from rsi_jax.view.server import make_server


@pytest.fixture
def running_run(tmp_path):
  rd = tmp_path / "run"
  (rd / "phases" / "rpr1").mkdir(parents=True)
  (rd / "config.yml").write_text("pipeline:\n  phases: [rpr1, rpr2]\n")
  rows = [{"phase": "rpr1", "kind": "rpr", "step": 1, "global_step": 1, "reward_mean": 0.5, "success_mean": 0.0}]
  (rd / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n" + '{"phase": "rpr1", "kind": "rpr", "st')
  t = Turn(0, 0, "action", np.zeros(3, np.int32), np.zeros(2, np.int32), np.zeros(2, np.float32), "eos", 4,
           text='{"command": "ls <b>"}', command="ls <b>", observation="a & b\n", exit_code=0)
  e = EpisodeResult("t1", "f", "json", "r", "ep1", verification_outcome(infra_error="container died"), turns=[t],
                    failure_kind="container_died")
  w = TranscriptWriter(rd / "phases" / "rpr1" / "episodes")
  w.write(1, [episode_record(e, index=0, values={0: (0.25, -0.5)}, instruction="do it")])
  w.close()
  srv = make_server(rd, port=0)
  th = threading.Thread(target=srv.serve_forever, daemon=True)
  th.start()
  yield rd, f"http://127.0.0.1:{srv.server_address[1]}"
  srv.shutdown()
  srv.server_close()


def _get(url):
  try:
    with urllib.request.urlopen(url, timeout=30) as r:
      return r.status, r.read().decode()
  except urllib.error.HTTPError as e:
    return e.code, e.read().decode()


def test_a_run_still_going_serves_every_page(running_run):
  rd, base = running_run
  status, body = _get(base + "/")
  assert status == 200 and "rpr1" in body and "rpr2" in body and "no evaluation yet" in body
  assert "data-metric='reward'" in body  # the complete metrics line drawn, the cut one left out
  status, body = _get(f"{base}/step?phase=rpr1&step=1")
  assert status == 200 and "ep1" in body and "container_died" in body
  src = urllib.parse.quote("phases/rpr1/episodes/1.jsonl.gz")
  status, body = _get(f"{base}/episode?src={src}&i=0")
  assert status == 200 and "ls &lt;b&gt;" in body and "a &amp; b" in body  # text escaped, never markup
  assert "data-value='0.25'" in body and "data-value='-0.5'" in body and "no CTRF report" in body
  for path in ("/phase?phase=rpr1", "/rsr?phase=rpr1", "/eval", "/evaluation?phase=rpr1&step=1"):
    assert _get(base + path)[0] == 200, path


def test_paths_outside_the_run_folder_are_refused(running_run):
  _, base = running_run
  for src in ("../../etc/passwd", "phases/../../x.jsonl.gz", "/etc/passwd", "config.yml"):
    assert _get(f"{base}/episode?src={urllib.parse.quote(src)}&i=0")[0] == 404, src
  assert _get(f"{base}/episode?src={urllib.parse.quote('phases/rpr1/episodes/1.jsonl.gz')}&i=5")[0] == 404
  assert _get(base + "/nothing")[0] == 404


@pytest.mark.parametrize("argv, says", [([], "give one run folder"), (["a", "b"], "unexpected argument 'b'"),
                                        (["/no/such/run"], "no such run folder")])
def test_usage_errors_are_one_line_and_exit_2(argv, says, capsys):
  from rsi_jax.view.__main__ import main
  with pytest.raises(SystemExit) as e:
    main(argv)
  err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
  assert e.value.code == 2 and len(err) == 1 and says in err[0]


def test_the_funnel_page_lists_planning_demonstrations_apart_from_accepted_trajectories(tmp_path):
  """rsr.plan_demonstrations' Q_clean records (kind planning, no episode; kind guided, the guided run of an
  accepted trajectory) are shown as the demonstrations kept as SFT samples, not as accepted trajectories."""
  rd = tmp_path / "run"
  f = rd / "phases" / "rsr0"
  f.mkdir(parents=True)
  (rd / "config.yml").write_text("pipeline:\n  phases: [rsr0]\n")
  (f / "runbooks.jsonl").write_text(json.dumps({"task": "t1", "harness": "json", "discovery": "d1", "k": 0,
                                                "runbook": "## Goal\nx", "accepted": True, "reasons": []}) + "\n")
  (f / "q_clean.jsonl").write_text(
      json.dumps({"task": "t1", "runbook": 0, "repeat": 0, "harness": "json", "episode_id": "ex1"}) + "\n"
      + json.dumps({"task": "t1", "runbook": 0, "repeat": 0, "harness": "json", "episode_id": None,
                    "kind": "planning"}) + "\n"
      + json.dumps({"task": "t1", "runbook": 0, "repeat": 0, "harness": "json", "episode_id": "ex1",
                    "kind": "guided"}) + "\n")
  srv = make_server(rd, port=0)
  threading.Thread(target=srv.serve_forever, daemon=True).start()
  try:
    status, body = _get(f"http://127.0.0.1:{srv.server_address[1]}/rsr?phase=rsr0")
  finally:
    srv.shutdown()
    srv.server_close()
  assert status == 200, body
  assert "planning demonstrations: 1" in body and "accepted trajectories: 1" in body and "ex1" in body
  assert "guided demonstrations: 1" in body
