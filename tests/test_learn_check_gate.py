"""scripts/learn_check_gate.py: the learning check stops before its plan when the Base's sampled success on the
validation split is below the floor, or when nothing was scored; it goes on at or above the floor."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import learn_check_gate  # noqa: E402


def _summary(tmp_path, mean, scored=64, infra=0):
  p = tmp_path / "summary.json"
  p.write_text(json.dumps({"n_tasks": 32, "runs": 2, "mean_at_r": mean, "scored_attempts": scored,
                           "infra_failures": infra, "n_refused": 0,
                           "sampling": {"temperature": 1.0, "top_p": 1.0}}))
  return str(p)


def test_a_flat_base_stops_the_check_and_a_base_at_the_floor_passes(tmp_path, capsys):
  assert learn_check_gate.main([_summary(tmp_path, 0.0)]) == 3
  err = capsys.readouterr().err
  assert "the Base solves 0.0% of 64 sampled attempts on 32 validation tasks (Mean@2, T=1.0, top_p 1.0)" in err
  assert "the check stops here" in err and "--no-gate" in err
  assert learn_check_gate.main([_summary(tmp_path, 9.9)]) == 3
  assert learn_check_gate.main([_summary(tmp_path, 10.0)]) == 0
  assert "needs >= 10%" in capsys.readouterr().out
  assert learn_check_gate.main([_summary(tmp_path, 12.0), "--min", "15"]) == 3


def test_nothing_scored_is_not_a_pass_and_a_missing_summary_is_a_usage_error(tmp_path, capsys):
  assert learn_check_gate.main([_summary(tmp_path, None, scored=0, infra=64)]) == 3
  assert "no attempt on the validation split was scored (64 infrastructure failures" in capsys.readouterr().err
  assert learn_check_gate.main([str(tmp_path / "absent.json")]) == 2
  assert "cannot read" in capsys.readouterr().err
