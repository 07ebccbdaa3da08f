"""scripts/learn_check_rewrite.py's comparison on two run folders: the funnel's counts and rejections from each
manifest, the turns of the accepted trajectories only, and the held-out result of each run's last evaluated step."""

import gzip
import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import learn_check_rewrite  # noqa: E402


def _run(root: Path, name: str, num_runbooks: int, accepted: dict, rejected: dict, evals: dict,
         empty_reason: str | None = None, phase: str = "rsr1") -> Path:
  """A run folder with an rsr1 funnel (``accepted``: episode id -> accepted?, with the turns it took) and
  evaluations (step -> Mean@R)."""
  f = root / name / "phases" / "rsr1"
  (f / "episodes").mkdir(parents=True)
  stages = {"attempted": 10, "discovered": 4, "planned": 4 * num_runbooks, "accepted": sum(a for a, _ in
                                                                                          accepted.values())}
  (f / "rsr_manifest.json").write_text(json.dumps({
      "policy": "the actor", "settings": {"num_runbooks": num_runbooks}, "empty_reason": empty_reason,
      "stages": {**stages, "rejected": rejected}}))
  (f / "q_clean.jsonl").write_text("".join(json.dumps({"episode_id": e}) + "\n" for e, (a, _) in accepted.items()
                                           if a))
  half = len(accepted) // 2  # the records in two transcript files (discovery, execution)
  for part, items in (("discovery", list(accepted.items())[:half]), ("execution", list(accepted.items())[half:])):
    with gzip.open(f / "episodes" / f"{part}.jsonl.gz", "wt") as g:
      for e, (_, turns) in items:
        g.write(json.dumps({"episode_id": e, "turns": [{}] * turns}) + "\n")
  for step, mean in evals.items():
    d = root / name / "eval" / phase / str(step)
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"mean_at_r": mean, "pass_at_r": mean + 5, "runs": 3}))
  return root / name


def test_compare_counts_accepted_turns_and_the_last_evaluation(tmp_path, capsys):
  a = _run(tmp_path, "a", 0, {"e1": (True, 1), "e2": (True, 1), "e3": (False, 4)}, {}, {2: 20.0})
  b = _run(tmp_path, "b", 2, {"r1": (True, 2), "r2": (False, 9), "r3": (True, 3), "r4": (True, 4)},
           {"compatibility": 3, "grounding": 1}, {9: 10.0, 10: 30.0})
  assert learn_check_rewrite.main(["--compare", str(a), str(b)]) == 0
  out = json.loads((b / "rewrite_comparison.json").read_text())
  assert out["self-imitation"]["turns_per_accepted"] == 1.0 and out["self-imitation"]["accepted_with_turns"] == 2
  assert out["rewrite"]["turns_per_accepted"] == 3.0 and out["rewrite"]["accepted_with_turns"] == 3
  assert out["rewrite"]["mean_at_r"] == 30.0 and out["self-imitation"]["mean_at_r"] == 20.0  # step 10, not 9
  assert out["rewrite"]["stages"]["planned"] == 8 and out["rewrite"]["rejected"] == {"compatibility": 3,
                                                                                     "grounding": 1}
  text = capsys.readouterr().out
  assert re.search(r"\n  rejected: compatibility +0 +3\n", text) and re.search(r"\naccepted +2 +3\n", text)
  assert re.search(r"\nheld-out Mean@3 +20\.0 +30\.0\n", text), text


def test_usage_and_a_run_without_a_base_checkpoint_are_refused(tmp_path, capsys):
  assert learn_check_rewrite.main([]) == 2
  (tmp_path / "r").mkdir()
  assert learn_check_rewrite.main([str(tmp_path / "r")]) == 2
  assert "no Base in" in capsys.readouterr().err
  # a --stand-in-base run: RSR-1 is its first phase and starts from the imported Base; another first phase does not
  (tmp_path / "r" / "config.yml").write_text("model: {hf_path: runs/stand_in_base/hf}\n"
                                             "pipeline: {phases: [rsr1, critic_seed, rpr1]}\n")
  assert learn_check_rewrite.base_weights(tmp_path / "r") == []
  (tmp_path / "r" / "config.yml").write_text("model: {hf_path: runs/stand_in_base/hf}\n"
                                             "pipeline: {phases: [rsr0, rsr1]}\n")
  with pytest.raises(FileNotFoundError, match="neither an rsr0 checkpoint nor an imported model.hf_path"):
    learn_check_rewrite.base_weights(tmp_path / "r")
  (tmp_path / "r" / "checkpoints" / "rsr0").mkdir(parents=True)
  assert learn_check_rewrite.base_weights(tmp_path / "r") == [
      f"pipeline.actor_from={{rsr1: {tmp_path / 'r' / 'checkpoints' / 'rsr0'}}}"]


def test_a_phase_that_trained_nothing_reports_the_base_row_and_the_configured_runs(tmp_path, capsys):
  """RSR-1 with an empty Q_clean trains nothing and is not evaluated: its held-out row is the Base's (the weights
  are unchanged), labelled so; with no evaluation at all, R comes from the run's config, not "Mean@None"."""
  none = "no discovery episode verified (192 attempted)"
  a = _run(tmp_path, "a", 0, {}, {}, {0: 12.5}, empty_reason=none, phase="base")
  b = _run(tmp_path, "b", 2, {}, {}, {}, empty_reason=none)
  (b / "config.yml").write_text("eval: {repeats: 4}\n")
  assert learn_check_rewrite.main(["--compare", str(a), str(b)]) == 0
  out = json.loads((b / "rewrite_comparison.json").read_text())
  assert out["self-imitation"]["mean_at_r"] == 12.5 and out["self-imitation"]["held_out_from"] == "base"
  assert out["rewrite"]["mean_at_r"] is None and out["rewrite"]["held_out_from"] is None
  assert out["rewrite"]["runs"] == 4
  text = capsys.readouterr().out
  assert re.search(r"\nheld-out Mean@4 +12\.5 +n/a\n", text), text
  assert f"self-imitation: {none} (its held-out row is the Base's: the weights are unchanged)" in text
  # a phase that did train but was not evaluated has no held-out row: the Base's would misreport it
  c = _run(tmp_path, "c", 0, {"e1": (True, 1)}, {}, {0: 12.5}, phase="base")
  assert learn_check_rewrite.variant(c, "rsr1")["mean_at_r"] is None
