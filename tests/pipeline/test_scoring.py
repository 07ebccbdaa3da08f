"""Scoring and filtering a rollout step's episodes (pipeline/scoring.py), on real episode records: the
infrastructure mask, the staleness bound, one reward per trainable episode at its last generated token, the
reasons when nothing is left to train on, and the batch assemble_batch gives for the episodes kept."""

import numpy as np
import pytest

from rsi_jax.env.episode import EpisodeResult
from rsi_jax.env.harness import Segment
from rsi_jax.pipeline.errors import NoTrainableSamples
from rsi_jax.pipeline.scoring import score_and_filter
from rsi_jax.rl.batch import assemble_batch, episode_samples
from rsi_jax.rl.ctrf import verification_outcome
from rsi_jax.rl.divisors import DivisorTable, FamilyDivisor

TABLE = DivisorTable({"alpha": FamilyDivisor(4.0)}, fallback_divisor=2.0, kind="fdr")
PAD = dict(pad_multiple=8, pad_id=3)


def _segment(index: int, prompt: int, versions, seed: int = 0) -> Segment:
  """``prompt`` observation tokens, then one generated token per entry of ``versions`` (its weight version)."""
  rng = np.random.default_rng(seed)
  n = prompt + len(versions)
  gen = np.arange(n) >= prompt
  return Segment(index, rng.integers(10, 1000, n).astype(np.int32), gen,
                 np.where(gen, -rng.random(n), 0).astype(np.float32), np.where(gen, index, -1).astype(np.int32),
                 np.array([-1] * prompt + list(versions), np.int32))


def _episode(i: int, family: str, segments, passed: int = 0, failed: int = 0, infra: str = "",
             stop_reason: str = "done") -> EpisodeResult:
  if infra:
    out = verification_outcome(infra_error=infra)
  else:
    tests = [{"name": f"t::p{k}", "status": "passed"} for k in range(passed)]
    tests += [{"name": f"t::f{k}", "status": "failed"} for k in range(failed)]
    out = verification_outcome({"results": {"tests": tests}}, exit_code=1 if failed else 0)
  return EpisodeResult(f"task{i}", family, "json", "run", f"ep{i}", out, segments=list(segments),
                       stop_reason=stop_reason, failure_kind="container_died" if infra else "")


def _step():
  """Five episodes scored at weight version 5 with max_staleness 2."""
  return [
      # 0: scored, two segments (summarization), tokens of versions 4 and 5; 3 of 4 checks passed
      _episode(0, "alpha", [_segment(0, 3, [4, 4], 1), _segment(1, 2, [5, 5, 5], 2)], passed=3, failed=1),
      # 1: an infrastructure failure: masked, never scored
      _episode(1, "beta", [_segment(0, 2, [5, 5], 3)], infra="container died"),
      # 2: a token sampled 3 updates ago (version 2): too stale to train
      _episode(2, "beta", [_segment(0, 2, [2, 5], 4)], passed=2),
      # 3: exactly max_staleness updates old (version 3): trained; its last segment generated nothing, so the
      #    reward sits on the first segment's last generated token
      _episode(3, "beta", [_segment(0, 2, [3, 3, 3], 5), _segment(1, 4, [], 6)], passed=1, failed=2),
      # 4: scored (a failure, report valid: P / D) with no trace of staleness
      _episode(4, "gamma", [_segment(0, 1, [5], 7)], passed=0, failed=1),
  ]


def _score(eps, version=5, max_staleness=2):
  return score_and_filter(eps, TABLE, "fdr", version, max_staleness, where="rpr1 step 7", **PAD)


def test_masks_staleness_and_rewards_at_the_last_generated_token():
  eps = _step()
  s = _score(eps)
  # FDR: P / D_f (alpha 4, others the fallback 2); the infrastructure failure gets 0 and mask 0
  np.testing.assert_allclose(s.rewards, [3 / 4, 0.0, 2 / 2, 1 / 2, 0.0])
  np.testing.assert_array_equal(s.mask, [1, 0, 1, 1, 1])
  np.testing.assert_array_equal(s.too_old, [False, False, True, False, False])
  np.testing.assert_array_equal(s.ok, [True, False, False, True, True])
  assert s.trainable == [0, 3, 4]
  b = s.batch
  # rows: ep0 seg0, ep0 seg1, ep1, ep2, ep3 seg0, ep3 seg1, ep4; masked episodes' rows do not train
  np.testing.assert_array_equal(b.row_mask, [1, 1, 0, 0, 1, 1, 1])
  assert b.gen_mask[2].sum() == 0 and b.gen_mask[3].sum() == 0
  # one terminal reward per trainable episode, on its last generated token, nowhere else
  assert int(b.dones.sum()) == len(s.trainable) == 3
  assert [tuple(x) for x in np.argwhere(b.dones)] == [(1, 4), (4, 4), (6, 1)]
  assert b.rewards[1, 4] == pytest.approx(3 / 4) and b.rewards[4, 4] == pytest.approx(1 / 2)
  assert np.count_nonzero(b.rewards[b.dones == 0]) == 0
  np.testing.assert_array_equal(b.next_row[[0, 4]], [1, 5])  # summarization carries on, not a terminal event


def test_batch_is_what_assemble_batch_gives_for_the_kept_episodes():
  eps = _step()
  s = _score(eps)
  samples = [episode_samples(e.segments, j) for j, e in enumerate(eps)]
  want = assemble_batch(samples, [3 / 4, 0.0, 1.0, 1 / 2, 0.0], [True, False, False, True, True], **PAD)
  for name, got, exp in zip(want._fields, s.batch, want):
    np.testing.assert_array_equal(got, exp, err_msg=name)


def test_staleness_follows_the_weight_version_and_the_bound():
  eps = _step()
  # one update later, episode 3 (version 3) is 3 updates old as well; with a bound of 3 both it and 2 train
  np.testing.assert_array_equal(_score(eps, version=6).too_old, [False, False, True, True, False])
  np.testing.assert_array_equal(_score(eps, version=5, max_staleness=3).ok, [True, False, True, True, True])


def test_nothing_to_train_on_names_the_reasons():
  eps = [_episode(0, "beta", [_segment(0, 2, [5], 1)], infra="container died"),
         _episode(1, "beta", [_segment(0, 2, [1, 5], 2)], passed=1),
         _episode(2, "beta", [_segment(0, 6, [], 3)], stop_reason="context_exhausted"),
         _episode(3, "beta", [], stop_reason="")]
  with pytest.raises(NoTrainableSamples) as e:
    _score(eps)
  assert str(e.value) == ("rpr1 step 7: none of the 4 episodes has a trainable generated token "
                          "({'container_died': 1, 'done': 1, 'context_exhausted': 1, 'no generated token': 1}): "
                          "infrastructure failures 1, too stale 1")
