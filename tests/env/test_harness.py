"""Harnesses with a real tokenizer and real containers: token-in/token-out prompts, per-turn records,
malformed actions, limits, proactive summarization into linear segments, the XML convention."""

import json
import time

import pytest

from rsi_jax.env.harness import (STOP_AGENT_TIMEOUT, STOP_DONE, STOP_MAX_TURNS, TURN_ACTION, TURN_SUMMARY,
                                 JsonHarness, ScriptedPolicy, XmlHarness, build_segment)
from rsi_jax.env.episode import run_episode
from rsi_jax.env.sandbox import DockerSandbox
from rsi_jax.policy import FINISH_LENGTH, SamplingParams

pytestmark = pytest.mark.docker

SOLVE = ["echo 'hello, sandbox' > /app/greeting.txt", "cd /app && wc -l < input.txt > count.txt && cat count.txt"]


@pytest.fixture(scope="module")
def box(docker_client, run_id):
  with DockerSandbox(docker_client, "rsi-base", run_id=run_id, task_name="harness-test") as b:
    yield b


def json_agent(tokenizer, renderer, replies, **kw):
  kw.setdefault("max_turns", 8)
  return JsonHarness(ScriptedPolicy(tokenizer, replies, weight_version=3), renderer,
                     SamplingParams(max_new_tokens=kw.pop("max_new_tokens", 512)), command_timeout_s=20, **kw)


def test_token_in_token_out_episode(docker_client, settings, fixture_tasks, tokenizer, renderer):
  task = fixture_tasks["harbor-greeting"]
  replies = [json.dumps({"command": c, "done": False}) for c in SOLVE] + ['{"done": true}']
  h = json_agent(tokenizer, renderer, replies)
  r = run_episode(task, h, docker_client, settings)
  assert r.success == 1 and r.stop_reason == STOP_DONE and len(r.turns) == 3
  t0 = r.turns[0]
  msgs = [{"role": "system", "content": h.system_prompt()}, {"role": "user", "content": task.instruction.strip()}]
  assert t0.prompt_ids.tolist() == renderer.render(msgs, add_generation_prompt=True).ids.tolist()
  for a, b in zip(r.turns, r.turns[1:]):
    want = (a.prompt_ids.tolist() + a.sampled_ids.tolist() + renderer.close_turn(a.sampled_ids)
            + renderer.render_message("tool", a.observation) + renderer.generation_prompt())
    assert b.prompt_ids.tolist() == want
  assert json.loads(r.turns[1].observation) == {"exit_code": 0, "timed_out": False, "output": "3\n"}
  assert all(t.weight_version == 3 and t.logprobs.shape == t.sampled_ids.shape for t in r.turns)
  assert r.prompt_tokens == sum(len(t.prompt_ids) for t in r.turns)
  assert r.generated_tokens == sum(len(t.sampled_ids) for t in r.turns)
  # the segment is the whole conversation as the chat template renders it, generated tokens masked in
  (seg,) = r.segments
  for t in r.turns:
    msgs += [{"role": "assistant", "content": t.text}] + ([{"role": "tool", "content": t.observation}]
                                                          if t is not r.turns[-1] else [])
  ref = renderer.render(msgs)
  n = len(seg.ids)
  assert seg.ids.tolist() == ref.ids[:n].tolist() and n == len(ref.ids) - 1  # (the final newline is not sampled)
  assert seg.gen_mask.tolist() == ref.gen_mask[:n].tolist()
  assert seg.gen_mask.sum() == r.generated_tokens
  assert set(seg.turn_ids[seg.gen_mask].tolist()) == {0, 1, 2}
  assert (seg.weight_versions[seg.gen_mask] == 3).all() and (seg.weight_versions[~seg.gen_mask] == -1).all()
  # the public record: JSON-serializable, and a transcript of commands and observations only
  rec = json.loads(json.dumps(r.to_dict()))
  assert rec["success"] == 1 and [t["command"] for t in rec["turns_detail"]] == SOLVE + [None]
  assert [m["role"] for m in r.transcript()] == ["assistant", "tool", "assistant", "tool", "assistant"]


def test_malformed_action_continues(box, fixture_tasks, tokenizer, renderer):
  h = json_agent(tokenizer, renderer, ["let me run ls", '{"cmd": "ls"}', '{"command": "echo ok"}'])
  run = h.run(box, fixture_tasks["harbor-greeting"], deadline=time.time() + 60)
  t = run.turns
  assert t[0].error and t[0].observation.startswith("Invalid action: no JSON object")
  assert "unknown field" in t[1].observation and t[1].command is None
  assert json.loads(t[2].observation)["output"] == "ok\n"
  assert run.stop_reason == STOP_DONE and len(t) == 4


def test_cut_off_reply_gets_end_of_turn(box, fixture_tasks, tokenizer, renderer):
  h = json_agent(tokenizer, renderer, ['{"command": "echo a very long command that will not fit"}'],
                 max_new_tokens=4, max_turns=1)
  run = h.run(box, fixture_tasks["harbor-greeting"], deadline=time.time() + 60)
  t = run.turns[0]
  assert t.finish_reason == FINISH_LENGTH and len(t.sampled_ids) == 4 and t.error
  assert renderer.close_turn(t.sampled_ids)[0] == tokenizer.im_end_id
  assert run.stop_reason == STOP_MAX_TURNS


def test_max_turns_and_agent_timeout(box, fixture_tasks, tokenizer, renderer):
  task = fixture_tasks["harbor-greeting"]
  h = json_agent(tokenizer, renderer, [], max_turns=3)
  h.policy.default = '{"command": "true"}'
  run = h.run(box, task, deadline=time.time() + 60)
  assert run.stop_reason == STOP_MAX_TURNS and len(run.turns) == 3
  h = json_agent(tokenizer, renderer, ['{"command": "sleep 30"}'])
  t0 = time.time()
  run = h.run(box, task, deadline=time.time() + 2)
  assert run.stop_reason == STOP_AGENT_TIMEOUT and run.turns[0].timed_out and time.time() - t0 < 15


def test_summarization_starts_a_new_linear_segment(box, fixture_tasks, tokenizer, renderer):
  task = fixture_tasks["harbor-greeting"]
  probe = json_agent(tokenizer, renderer, [])
  threshold = len(probe.initial_prompt(task)) + 60
  replies = ['{"command": "seq 1 40"}', "Listed numbers 1..40; nothing else done yet.", '{"command": "pwd"}']
  h = json_agent(tokenizer, renderer, replies, summarize_threshold_tokens=threshold)
  run = h.run(box, task, deadline=time.time() + 60)
  kinds = [t.kind for t in run.turns]
  assert kinds[:3] == [TURN_ACTION, TURN_SUMMARY, TURN_ACTION] and run.stop_reason != "context_exhausted"
  assert len(run.segments) >= 2 and [t.segment for t in run.turns[:3]] == [0, 0, 1]
  s = run.turns[1]
  assert s.text == replies[1] and "Summarize your progress" in renderer.decode(s.prompt_ids[-200:])
  assert run.turns[2].prompt_ids.tolist() == h.initial_prompt(task, summary=replies[1])
  assert json.loads(run.turns[2].observation)["output"] == "/app\n"  # the episode went on
  seg0 = run.segments[0]
  assert seg0.gen_mask.sum() == len(run.turns[0].sampled_ids) + len(s.sampled_ids)
  assert seg0.ids.tolist() == s.prompt_ids.tolist() + s.sampled_ids.tolist()


def test_no_summary_on_the_last_allowed_turn(box, fixture_tasks, tokenizer, renderer):
  """Past the threshold on the last allowed action, the episode ends there: a summary nobody acts on would
  take the terminal reward (the summary request is made only when another action follows)."""
  task = fixture_tasks["harbor-greeting"]
  probe = json_agent(tokenizer, renderer, [])
  threshold = len(probe.initial_prompt(task)) + 60
  replies = ['{"command": "seq 1 40"}', "summary", '{"command": "seq 1 40"}', "summary 2"]
  run = json_agent(tokenizer, renderer, replies, summarize_threshold_tokens=threshold, max_turns=2).run(
      box, task, deadline=time.time() + 60)
  assert [t.kind for t in run.turns] == [TURN_ACTION, TURN_SUMMARY, TURN_ACTION]
  assert run.stop_reason == STOP_MAX_TURNS and run.turns[-1].kind == TURN_ACTION
  assert len(run.segments) == 2
  run = json_agent(tokenizer, renderer, replies, summarize_threshold_tokens=threshold, max_turns=1).run(
      box, task, deadline=time.time() + 60)
  assert [t.kind for t in run.turns] == [TURN_ACTION] and len(run.segments) == 1


def test_build_segment_rejects_non_linear_history(box, fixture_tasks, tokenizer, renderer):
  h = json_agent(tokenizer, renderer, ['{"command": "true"}'], max_turns=2)
  h.policy.default = '{"command": "true"}'
  run = h.run(box, fixture_tasks["harbor-greeting"], deadline=time.time() + 60)
  run.turns[1].prompt_ids = run.turns[1].prompt_ids.copy()
  run.turns[1].prompt_ids[len(run.turns[0].prompt_ids)] += 1  # as if turn 0's sample had been re-tokenized
  with pytest.raises(AssertionError, match="not linear"):
    build_segment(0, run.turns)


def test_xml_harness(docker_client, settings, fixture_tasks, tokenizer, renderer):
  replies = [f"<command>{c}</command>" for c in SOLVE] + ["All done.\n<done/>"]
  h = XmlHarness(ScriptedPolicy(tokenizer, replies), renderer, SamplingParams(max_new_tokens=512), max_turns=6)
  r = run_episode(fixture_tasks["harbor-greeting"], h, docker_client, settings)
  assert r.success == 1 and r.harness == "xml" and r.stop_reason == STOP_DONE
  assert r.turns[1].observation == '<output exit_code="0">\n3\n</output>'
  assert "<command>" in h.system_prompt() and "JSON" not in h.system_prompt()


def test_a_lowered_summarization_threshold_is_logged_once_not_once_per_harness(caplog):
  """Every RSR funnel builds hundreds of harnesses over one sampler: the lowered threshold is said once (a
  learning-check run's log had it 868 times), and a new limit is said again."""
  import logging

  from rsi_jax.env.harness import summarize_threshold

  class Small:
    max_prompt_tokens = 4_567

  class Smaller:
    max_prompt_tokens = 3_001

  with caplog.at_level(logging.INFO, logger="rsi_jax.env.harness"):
    assert [summarize_threshold(32_000, Small()) for _ in range(5)] == [4_567 - 512] * 5
    assert summarize_threshold(32_000, Smaller()) == 3_001 - 512
  said = [r.getMessage() for r in caplog.records if "lowered" in r.getMessage()]
  assert said == ["summarization threshold 32000 lowered to 4055: the policy accepts prompts of at most 4567 "
                  "tokens", "summarization threshold 32000 lowered to 2489: the policy accepts prompts of at most "
                  "3001 tokens"]
