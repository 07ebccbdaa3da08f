"""The paged scheduler on its own (no server loop): reservation, chunked prefill, block tables, reuse, swap."""

import dataclasses

import jax
import numpy as np

from rsi_jax import policy as P
from rsi_jax.sampler.paged_scheduler import PagedScheduler
from rsi_jax.sampler.request import ServerStats
from tests.sampler.conftest import BLOCK, CHUNK, VOCAB, engine_with


@dataclasses.dataclass(eq=False)
class Req:
  """The request fields the scheduler reads (the server's own request record has these and more)."""
  prompt: np.ndarray
  params: P.SamplingParams
  key: jax.Array
  tokens: list = dataclasses.field(default_factory=list)
  done: bool = False
  start_version: int = 0
  version: int = 0
  kv: object = None


def req(prompt, max_new_tokens, version=0):
  return Req(np.asarray(prompt, np.int32), P.SamplingParams(max_new_tokens=max_new_tokens),
             jax.random.key(0), start_version=version, version=version)


def test_reserve_prefill_in_chunks_release_and_reuse(engine_paged, actor_params):
  """A 20-token prompt: 3 blocks reserved, prefilled in chunks of 8, 8 and 4 (the last gives its first token),
  decode tables cover the next call; released finished, its 2 full prompt blocks stay cached and the next
  request with that prefix starts prefilling at 16. After a swap nothing is reused."""
  engine, stats = engine_paged, ServerStats()
  sched = PagedScheduler(engine, prefix_cache=True, decode_steps=2, version=0, stats=stats)
  params, state = engine.load_params(actor_params), engine.init_decode_state()
  empty = engine.kv_blocks  # the table entry of no block
  assert engine.chunk_size == CHUNK and engine.block_size == BLOCK
  prompt = np.random.default_rng(0).integers(0, VOCAB, 20)

  a = req(prompt, max_new_tokens=4)
  assert sched.admit(0, a)
  assert sched.pool.reserved == 3 and a.kv.cursor == 0 and list(sched.prefilling) == [(0, a)]
  records = []
  for _ in range(3):
    assert not sched.decoding(a)
    state, rec = sched.prefill_step(params, state)
    records.append(rec)
  assert records[0] == records[1] == [] and len(records[2]) == 1 and records[2][0][:2] == (0, a)
  assert 0 <= int(jax.device_get(records[2][0][2])[0]) < VOCAB
  assert sched.decoding(a) and not sched.prefilling
  assert (stats.prefill_chunks, stats.prefill_tokens, stats.prefills) == (3, 20, 1)
  assert len(a.kv.blocks) == 3 and a.kv.reserve == 0 and sched.pool.reserved == 0
  st, rec = sched.prefill_step(params, state)
  assert st is state and rec == []  # nothing left to prefill

  tables = np.asarray(sched.decode_tables([a, None, None, None]))
  assert tables[0, :3].tolist() == a.kv.blocks and (tables[0, 3:] == empty).all() and (tables[1:] == empty).all()
  assert a.kv.decode_pos == 22 and stats.kv_live_positions == 20 and stats.kv_held_positions == 3 * BLOCK

  a.tokens = [1, 2, 3, 4]
  sched.release(0, a, finished=True)
  assert (sched.tables[0] == empty).all() and a.kv.blocks == [] and not a.kv.decoding
  sched.pool.check_idle()
  assert len(sched.pool.evictable) == 2  # the prompt's full blocks (20 + 4 - 1 positions: still 2 full)

  b = req(np.concatenate([prompt, [5, 6, 7]]), max_new_tokens=4)
  assert sched.admit(1, b)
  assert b.kv.cursor == 2 * BLOCK == stats.reused_tokens and b.kv.blocks == sched.tables[1, :2].tolist()
  assert sched.pool.reserved == 2  # 23 + 4 positions: 4 blocks, 2 of them cached

  sched.swap(1)
  c = req(prompt, max_new_tokens=4, version=1)
  assert sched.admit(2, c)
  assert c.kv.cursor == 0 and stats.reused_tokens == 2 * BLOCK
  for slot, r in ((1, b), (2, c)):
    sched.release(slot, r, finished=False)
  sched.prefilling.clear()
  sched.pool.check_idle()



def test_admission_refused_when_the_pool_cannot_reserve(cfg):
  """A pool of 8 blocks: a request of 30 + 26 positions reserves 7, the next such request is refused and
  takes nothing; once the first is released it is admitted."""
  engine = engine_with(cfg, decode_impl="paged", block_size=BLOCK, prefill_chunk=CHUNK, kv_blocks=8)
  sched = PagedScheduler(engine, prefix_cache=True, decode_steps=1, version=0, stats=ServerStats())
  first, second = (req(np.arange(30) + i, max_new_tokens=26) for i in range(2))
  assert sched.admit(0, first) and sched.pool.reserved == 7 and sched.pool.available() == 1
  assert not sched.admit(1, second)
  assert second.kv.blocks == [] and second.kv.reserve == 0 and sched.pool.reserved == 7
  assert list(sched.prefilling) == [(0, first)] and (sched.tables[1] == engine.kv_blocks).all()
  sched.release(0, first, finished=False)
  sched.prefilling.clear()
  assert sched.admit(1, second) and sched.pool.reserved == 7


def test_a_turn_prefills_several_short_prompts_up_to_one_chunk_of_tokens(cfg, actor_params):
  """32-token chunks: prompts of 5, 9 and 14 tokens (16-token chunks each) admitted together take two turns
  (two fit one chunk's budget, the third waits); a 40-token prompt (chunks of 32 and 8) ahead of a short one
  fills its first turn alone, then its last chunk and the short prompt share the next. Each first token
  equals the one the request gets prefilled alone."""
  engine = engine_with(cfg, decode_impl="paged", block_size=BLOCK, prefill_chunk=32)
  params = engine.load_params(actor_params)
  rng = np.random.default_rng(2)
  prompts = [rng.integers(0, VOCAB, n) for n in (5, 9, 14, 40, 6)]

  def run(groups):
    """Admit each group at once and prefill it to the end: (prompt indices completed per turn, first token per
    prompt index, stats)."""
    stats = ServerStats()
    sched = PagedScheduler(engine, prefix_cache=False, decode_steps=1, version=0, stats=stats)
    state, turns, first = engine.init_decode_state(), [], {}
    for group in groups:
      admitted = {}
      for slot, i in enumerate(group):
        r = req(prompts[i], max_new_tokens=2)
        assert sched.admit(slot, r)
        admitted[id(r)] = (slot, r, i)
      while sched.prefilling:
        state, rec = sched.prefill_step(params, state)
        turns.append(sorted(admitted[id(r)][2] for _, r, _, _ in rec))
        first.update({admitted[id(r)][2]: int(jax.device_get(tok)[0]) for _, r, tok, _ in rec})
      for slot, r, _ in admitted.values():
        sched.release(slot, r, finished=False)
    sched.pool.check_idle()
    return turns, first, stats

  turns, first, stats = run([[0, 1, 2], [3, 4]])
  assert turns == [[0, 1], [2], [], [3, 4]]
  assert stats.prefill_chunks == 6 and stats.prefills == 5
  _, alone, _ = run([[i] for i in range(5)])
  assert first == alone
