"""Episode transcripts: a real episode's turns and checks written and read back, the harness's output cap kept,
the keep modes (all, failures, a seeded sample), the values / advantages at turn boundaries, the background
writer (flush, whole files only, redone steps replaced, a cut file read as far as it goes)."""

import gzip
import json
import time

import numpy as np
import pytest

from rsi_jax.env.harness import Segment, Turn
from rsi_jax.env.episode import EpisodeResult
from rsi_jax.env.transcripts import (TranscriptWriter, boundary_values, episode_record, parse_keep,
                                     read_transcripts, select)
from rsi_jax.rl.ctrf import verification_outcome


def _ctrf(*tests):
  return {"results": {"tests": [{"name": n, "status": s} for n, s in tests]}}


def _episode(i: int, success: int | None, segments=(), turns=()) -> EpisodeResult:
  if success is None:
    out = verification_outcome(infra_error="container died")
  else:
    out = verification_outcome(_ctrf(("t::a", "passed"), ("t::b", "passed" if success else "failed")),
                               exit_code=0 if success else 1)
  return EpisodeResult(f"task{i}", "fam", "json", "r", f"ep{i}", out, turns=list(turns), segments=list(segments),
                       failure_kind="container_died" if success is None else "")


@pytest.mark.docker
def test_round_trip_of_a_real_episode_with_the_harness_cap(docker_client, fixture_tasks, tokenizer, renderer,
                                                           run_id, tmp_path):
  """A real episode (malformed reply, a command whose output the sandbox cuts at env.output_cap_bytes, the
  solution, done): every turn's reply, command, malformed reason and output come back exactly as the agent saw
  them, and the CTRF report's check names and statuses with them."""
  from rsi_jax.env.harness import JsonHarness, ScriptedPolicy
  from rsi_jax.env.episode import EnvSettings, run_episode
  from rsi_jax.policy import SamplingParams
  cap = 400
  settings = EnvSettings(run_id=run_id, command_timeout_s=30.0, output_cap_bytes=cap)
  replies = ["not json at all",
             json.dumps({"command": "python3 -c \"print('x' * 5000)\"", "done": False}),
             json.dumps({"command": "echo 'hello, sandbox' > /app/greeting.txt", "done": False}),
             json.dumps({"command": "cd /app && wc -l < input.txt > count.txt", "done": False}),
             '{"done": true}']
  h = JsonHarness(ScriptedPolicy(tokenizer, replies, weight_version=7), renderer,
                  SamplingParams(max_new_tokens=512), command_timeout_s=20, max_turns=8, output_cap_bytes=cap)
  task = fixture_tasks["harbor-greeting"]
  e = run_episode(task, h, docker_client, settings)
  assert e.success == 1 and len(e.turns) == 5
  w = TranscriptWriter(tmp_path / "episodes")
  w.write(3, [episode_record(e, index=0, reward=1.0, divisor=3.0, instruction=task.instruction,
                             output_cap_bytes=cap)])
  w.close()
  (rec,) = read_transcripts(tmp_path / "episodes" / "3.jsonl.gz")
  assert rec["task"] == "harbor-greeting" and rec["harness"] == "json" and rec["weight_versions"] == [7]
  assert rec["stop_reason"] == "done" and rec["success"] == 1 and rec["state"] == "ok"
  assert rec["reward"] == 1.0 and rec["divisor"] == 3.0 and rec["output_cap_bytes"] == cap
  assert rec["instruction"] == task.instruction
  assert [c["name"] for c in rec["checks"]] == [
      "test_outputs.py::test_greeting", "test_outputs.py::test_count", "test_outputs.py::test_input_untouched"]
  assert all(c["status"] == "passed" and not c["hygiene"] for c in rec["checks"])
  assert len(rec["turns"]) == len(e.turns)
  for got, t in zip(rec["turns"], e.turns):
    assert got["reply"] == t.text and got["command"] == t.command and got["output"] == t.observation
    assert got["exit_code"] == t.exit_code and got["sampled_tokens"] == len(t.sampled_ids)
  assert rec["turns"][0]["malformed"] and rec["turns"][0]["command"] is None
  assert rec["turns"][1]["exit_code"] == 0
  seen = json.loads(rec["turns"][1]["output"])["output"]  # what the agent saw: cut by the sandbox's cap
  assert "x" * 100 in seen and len(seen.encode()) < 5000 and len(seen.encode()) <= cap + 200
  assert rec["turns"][4]["done"] and rec["times"]["total_s"] > 0


def test_keep_modes_all_failures_and_a_seeded_sample():
  eps = [_episode(i, s) for i, s in enumerate([1, 0, None, 1, 0, 1, 1, 0, 1, 1])]
  assert select(eps, "all", 0) == list(range(10))
  assert select(eps, "failures", 0) == [1, 2, 4, 7]  # unsuccessful and infrastructure failures
  a = select(eps, "sample:3", 11)
  assert len(a) == 3 == len(set(a)) and a == sorted(a) and a == select(eps, "sample:3", 11)
  assert len({tuple(select(eps, "sample:3", s)) for s in range(20)}) > 1  # the seed draws the sample
  assert select(eps, "sample:50", 1) == list(range(10))
  assert parse_keep("sample:16") == ("sample", 16)
  for bad in ("sample:0", "some", "sample"):
    with pytest.raises(ValueError, match="run.keep_transcripts"):
      parse_keep(bad)


def _segment(index, ids_turns):
  """A segment from [(turn id, generated?)...] per token."""
  turn_ids = np.array([t for t, _ in ids_turns], np.int32)
  gen = np.array([g for _, g in ids_turns], bool)
  n = len(ids_turns)
  return Segment(index, np.arange(n, dtype=np.int32) + 100, gen, np.zeros(n, np.float32), turn_ids,
                 np.where(gen, 1, -1).astype(np.int32))


def test_boundary_values_are_the_steps_values_at_each_turns_first_token():
  """Per turn, the critic value and TB-GAE advantage the step computed at the turn's first generated token,
  read from the batch rows of the right episode and segment (a summarized episode spans two rows; a masked
  episode has none)."""
  from rsi_jax.pipeline.rpr import linked_tb_gae, to_device_batch
  from rsi_jax.rl.batch import assemble_batch, episode_samples
  e0 = _episode(0, 1, segments=[_segment(0, [(-1, 0), (0, 1), (0, 1), (0, 0), (1, 1), (1, 1)]),
                                _segment(1, [(-1, 0), (-1, 0), (2, 1), (2, 1), (2, 0), (3, 1)])])
  e1 = _episode(1, None, segments=[_segment(0, [(-1, 0), (0, 1), (0, 1)])])
  e2 = _episode(2, 0, segments=[_segment(0, [(-1, 0), (-1, 0), (0, 1), (0, 0), (1, 1), (1, 1), (1, 1)])])
  eps = [e0, e1, e2]
  ok = [True, False, True]
  batch = assemble_batch([episode_samples(e.segments, j) for j, e in enumerate(eps)], [1.0, 0.0, 0.25], ok)
  values = np.random.default_rng(0).normal(size=batch.tokens.shape).astype(np.float32)
  adv = np.asarray(linked_tb_gae(values, to_device_batch(batch), 0.9, 0.8).advantages)
  got = boundary_values(eps, values, adv, ok)
  # rows: e0 seg0 = 0, e0 seg1 = 1, e1 = 2, e2 = 3; first generated token of each turn
  want0 = {0: (0, 1), 1: (0, 4), 2: (1, 2), 3: (1, 5)}
  assert got[0] == {t: (float(values[r, p]), float(adv[r, p])) for t, (r, p) in want0.items()}
  assert got[1] == {}
  assert got[2] == {0: (float(values[3, 2]), float(adv[3, 2])), 1: (float(values[3, 4]), float(adv[3, 4]))}
  assert got[0][3][1] == pytest.approx(1.0 - values[1, 5])  # the last turn: reward minus its value
  # and the record carries them turn by turn (a turn without generated tokens: none)
  turns = [Turn(k, 0 if k < 2 else 1, "action", np.zeros(1, np.int32), np.zeros(1, np.int32),
                np.zeros(1, np.float32), "eos", 1) for k in range(5)]
  rec = episode_record(dataclass_replace(e0, turns=turns), values=got[0])
  assert [(t["value"], t["advantage"]) for t in rec["turns"]] == [got[0][k] for k in range(4)] + [(None, None)]


def dataclass_replace(obj, **kw):
  import dataclasses
  return dataclasses.replace(obj, **kw)


def test_writer_runs_in_the_background_writes_whole_files_and_replaces_redone_steps(tmp_path):
  w = TranscriptWriter(tmp_path / "ep")
  slow = []

  def build():
    time.sleep(0.3)
    slow.append(1)
    return [{"step": 1, "k": k} for k in range(3)]
  t0 = time.time()
  w.write(1, build=build)
  assert time.time() - t0 < 0.2 and not slow  # the caller does not wait for the file
  w.write(2, [{"step": 2}])
  w.flush()
  assert [r["k"] for r in read_transcripts(w.path(1))] == [0, 1, 2]
  assert read_transcripts(w.path(2)) == [{"step": 2}]
  assert sorted(p.name for p in (tmp_path / "ep").iterdir()) == ["1.jsonl.gz", "2.jsonl.gz"]  # no temporaries
  w.write(2, [{"step": 2, "again": True}])  # a redone step replaces its file
  w.write("discovery", [{"stage": "discovery"}])
  w.flush()
  assert read_transcripts(w.path(2)) == [{"step": 2, "again": True}]
  w.remove_after(1)  # resuming after step 1: later step files go, stage files stay
  assert sorted(p.name for p in (tmp_path / "ep").iterdir()) == ["1.jsonl.gz", "discovery.jsonl.gz"]
  w.close()
  assert w.files_written == 4 and w.bytes_written > 0


def test_a_write_error_is_raised_by_flush(tmp_path):
  (tmp_path / "file").write_text("not a folder")
  w = TranscriptWriter(tmp_path / "file" / "ep")
  w.write(1, [{"a": 1}])
  with pytest.raises(OSError):
    w.flush()
  w.close()


def test_a_cut_file_reads_as_far_as_it_goes(tmp_path):
  recs = [{"i": i, "text": "y" * 2000 + str(i)} for i in range(50)]
  data = gzip.compress("".join(json.dumps(r) + "\n" for r in recs).encode())
  p = tmp_path / "cut.jsonl.gz"
  p.write_bytes(data[:len(data) * 2 // 3])
  got = read_transcripts(p)
  assert 0 < len(got) < 50 and got == recs[:len(got)]
  assert read_transcripts(tmp_path / "absent.jsonl.gz") == []
