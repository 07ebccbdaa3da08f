"""A run folder that an interrupted or resumed run leaves: records cut mid-line, steps redone after a resume."""

import json
import struct

from rsi_jax.pipeline.metrics import MetricLogger, read_jsonl


def _events(tb_dir):
  """Every event of every TensorBoard event file under ``tb_dir`` (TFRecord framing: length, crc, data, crc)."""
  from tensorboardX.proto import event_pb2
  out = []
  for f in sorted(tb_dir.glob("events.out.tfevents.*")):
    data, i = f.read_bytes(), 0
    while i < len(data):
      (n,) = struct.unpack("<Q", data[i:i + 8])
      ev = event_pb2.Event()
      ev.ParseFromString(data[i + 12:i + 12 + n])
      out.append((f.name, ev))
      i += 12 + n + 4
  return out


def test_metrics_cut_mid_line_loses_only_the_cut_record(tmp_path):
  m = MetricLogger(str(tmp_path), tensorboard=False)
  for i in range(3):
    m.log("rpr1", "rpr", i + 1, {"reward_mean": 0.1 * i})
  f = tmp_path / "metrics.jsonl"
  text = f.read_text()
  f.write_text(text[:-20])  # a kill in the middle of writing step 3's record
  m2 = MetricLogger(str(tmp_path), tensorboard=False)
  m2.truncate(["rpr1"], "rpr1", 2)
  m2.log("rpr1", "rpr", 3, {"reward_mean": 0.7})
  rows = read_jsonl(f)
  assert [(r["step"], r["reward_mean"]) for r in rows] == [(1, 0.0), (2, 0.1), (3, 0.7)]
  assert all(json.loads(line) for line in f.read_text().splitlines())  # every line whole


def test_resume_drops_redone_evaluations_and_purges_tensorboard(tmp_path):
  m = MetricLogger(str(tmp_path))
  for i in range(3):
    m.log("rsr1", "rsr", i + 1, {"nll_per_token": 3.0 - i})
  for i in range(3):
    m.log("rpr1", "rpr", i + 1, {"reward_mean": 0.1 * i})
    m.log_eval("rpr1", i + 1, "tasks", {"mean_at_r": 10.0 * i})
  m.close()
  # resumed after rpr1 step 1: steps 2 and 3 (global 5, 6) and their evaluations are redone
  m2 = MetricLogger(str(tmp_path))
  m2.truncate(["rsr1", "rpr1"], "rpr1", 1)
  m2.log("rpr1", "rpr", 2, {"reward_mean": 0.5})
  m2.log_eval("rpr1", 2, "tasks", {"mean_at_r": 50.0})
  m2.close()
  evals = read_jsonl(tmp_path / "eval" / "metrics.jsonl")
  assert [(r["phase"], r["step"], r["mean_at_r"]) for r in evals] == [("rpr1", 1, 0.0), ("rpr1", 2, 50.0)]
  events = _events(tmp_path / "tensorboard")
  first = {}
  for name, ev in events:  # each attempt's file, in the order they were written (names may share a second)
    first.setdefault(name, ev.wall_time)
  files = sorted(first, key=first.get)
  assert len(files) == 2
  # the resumed attempt's file starts with TensorBoard's purge marker at the first redone global step (5)
  starts = [ev.step for name, ev in events if name == files[1] and ev.HasField("session_log")
            and ev.session_log.status == ev.session_log.START]
  assert starts == [5]
  redone = [(ev.step, v.tag) for name, ev in events if name == files[1] for v in ev.summary.value]
  assert redone == [(5, "rpr1/reward_mean"), (5, "eval/tasks/mean_at_r")]


def test_stage_report_of_an_object_store_run_folder_is_written_there(tmp_path, monkeypatch):
  """A ``gs://`` run folder: the in-training evaluation summaries are read from it and the stage report is
  written into it, not into a local ``./gs:/...`` folder. No object store is reachable here, so epath's own
  test backend maps ``gs://bucket`` onto a local folder (a stand-in for the store only; the code under test
  goes through the same path library it uses for a real bucket)."""
  from etils import epath
  from etils.epath import testing

  from rsi_jax.eval.report import report_run
  from tests.eval.test_report import summary

  store = tmp_path / "bucket"
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.chdir(cwd)

  def local(fn, path, *a, **k):
    return fn(str(path).replace("gs://bucket", str(store)), *a, **k)

  def rename(fn, path, dst, *a, **k):
    return fn(str(path).replace("gs://bucket", str(store)), str(dst).replace("gs://bucket", str(store)), *a, **k)
  fns = {k: local for k in ("exists", "glob", "isdir", "listdir", "makedirs", "mkdir", "open", "remove", "rmtree",
                            "stat", "walk")}
  with testing.mock_epath(**fns, rename=rename, replace=rename):
    run = epath.Path("gs://bucket/run")
    for phase, mean in (("base", 10.0), ("rsr1", 30.0)):
      (run / "eval" / phase / "2").mkdir(parents=True)
      (run / "eval" / phase / "2" / "summary.json").write_text(json.dumps(summary("tasks", mean)))
    (run / "lineage.json").write_text(json.dumps([{"phase": "rsr1", "output": "checkpoints/rsr1/2"}]))
    rep = report_run("gs://bucket/run")
  assert rep["stages"] == ["base", "rsr1"]
  assert (store / "run" / "eval" / "report" / "report.md").read_text().startswith("# Evaluation report")
  assert (store / "run" / "eval" / "report" / "progression.png").read_bytes()[:4] == b"\x89PNG"
  assert list(cwd.iterdir()) == []  # nothing written under the current directory
