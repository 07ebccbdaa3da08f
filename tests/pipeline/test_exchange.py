"""What a rollout step sends between processes (EpisodeResult.for_exchange, encoded as distributed.gather_objects
encodes it): everything the step trains on and writes, and a size linear in the generated and observation tokens,
not in turns x context as the turns' full prompts are."""

import pickle

import numpy as np

from rsi_jax.distributed import encode
from rsi_jax.env.episode import EpisodeResult
from rsi_jax.env.harness import TURN_ACTION, Turn, build_segment
from rsi_jax.env.transcripts import episode_record
from rsi_jax.pipeline.scoring import score_and_filter
from rsi_jax.rl.ctrf import verification_outcome
from rsi_jax.rl.divisors import DivisorTable, FamilyDivisor

TABLE = DivisorTable({"alpha": FamilyDivisor(4.0)}, fallback_divisor=2.0, kind="fdr")


def _episode(turns: int, system: int, generated: int = 24, observation: int = 64, seed: int = 0) -> EpisodeResult:
  """An episode of ``turns`` turns in one segment, as the harness records it: each turn's prompt is the system
  prompt (``system`` tokens) and every earlier turn's sampled and observation tokens."""
  rng = np.random.default_rng(seed)
  ids = lambda n: rng.integers(10, 150_000, n).astype(np.int32)  # noqa: E731
  prompt, out = ids(system), []
  for k in range(turns):
    sampled = ids(generated)
    out.append(Turn(k, 0, TURN_ACTION, prompt, sampled, -rng.random(generated).astype(np.float32), "eos", 3,
                    text="x" * generated, command="ls", observation="y" * observation))
    prompt = np.concatenate([prompt, sampled, ids(observation)])
  tests = [{"name": "t::a", "status": "passed"}, {"name": "t::b", "status": "failed"}]
  return EpisodeResult("task", "alpha", "json", "run", f"ep{turns}-{system}",
                       verification_outcome({"results": {"tests": tests}}, exit_code=1), turns=out,
                       segments=[build_segment(0, out)], stop_reason="done", generated_tokens=turns * generated)


def _size(e: EpisodeResult) -> int:
  return len(encode([e.for_exchange()]))


def test_the_exchanged_form_trains_and_records_exactly_what_the_whole_episode_does():
  eps = [_episode(6, 300, seed=s) for s in range(3)]
  light = [pickle.loads(encode([e.for_exchange()]))[1][0] for e in eps]  # as another process receives it
  a, b = (score_and_filter(x, TABLE, "fdr", 3, 1, pad_multiple=8, pad_id=0, where="t") for x in (eps, light))
  for name in a.batch._fields:
    np.testing.assert_array_equal(getattr(a.batch, name), getattr(b.batch, name), err_msg=name)
  np.testing.assert_array_equal(a.rewards, b.rewards)
  assert [episode_record(x, index=0, reward=0.5, divisor=4.0) for x in eps] == \
         [episode_record(x, index=0, reward=0.5, divisor=4.0) for x in light]
  assert all(len(t.prompt_ids) == 0 and t.prompt_len > 0 for e in light for t in e.turns)
  assert [t.prompt_len for t in light[0].turns] == [len(t.prompt_ids) for t in eps[0].turns]


def test_bytes_per_episode_grow_linearly_with_turns_and_once_with_the_prompt():
  size = {(n, p): _size(_episode(n, p)) for n in (8, 16, 32) for p in (1000, 4000)}
  # linear in turns: each further turn adds the same bytes (its sampled + observation tokens, its records)
  d1, d2 = size[16, 1000] - size[8, 1000], size[32, 1000] - size[16, 1000]
  assert abs(d2 - 2 * d1) < 0.05 * d2, (d1, d2)
  per_token = d1 / (8 * (24 + 64))
  assert per_token < 40, per_token  # a segment token's five records (17 B) + a turn's sampled ids and logprobs
  # the system prompt travels once per segment, whatever the number of turns (not once per turn)
  grow = [size[n, 4000] - size[n, 1000] for n in (8, 16, 32)]
  assert max(grow) - min(grow) < 0.02 * grow[0], grow
  assert grow[0] < 3000 * 20, grow  # ~17 B per system-prompt token
  # the whole episode (every turn's prompt) is quadratic in turns: 6x the bytes at 32 turns of 4,000 tokens
  whole = {n: len(encode([_episode(n, 4000)])) for n in (8, 16, 32)}
  assert whole[32] - whole[16] > 2.2 * (whole[16] - whole[8]), whole  # linear: 2.0 (the light form: 2.0 +- 5 %)
  assert whole[32] > 5 * size[32, 4000], (whole, size[32, 4000])
