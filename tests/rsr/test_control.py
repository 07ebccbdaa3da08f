"""C(τ): strip_control removes harness-control content from transcripts of every harness and keeps the
commands with their observations."""

import json

import numpy as np
import pytest

from rsi_jax.env import actions as A
from rsi_jax.env.harness import (
  SUMMARY_REQUEST,
  TURN_ACTION,
  TURN_SUMMARY,
  Turn,
  _summary_request,
)
from rsi_jax.env.episode import EpisodeResult
from rsi_jax.rl.ctrf import verification_outcome
from rsi_jax.rsr import strip_control
from rsi_jax.rsr.control import control_free_steps

FMT = {"json": A.format_json_observation, "xml": A.format_xml_observation}


def action(harness, cmd=None, done=False):
  if harness == "json":
    return json.dumps({"command": cmd, "done": done} if cmd else {"done": done})
  return (f"<command>{cmd}</command>" if cmd else "") + ("<done/>" if done else "")


def transcript(harness):
  """What an agent's chat looks like under ``harness``: a malformed reply and its notice, two commands, a
  summary request (carrying the last observation) and the summary, a banner, then the last command."""
  obs = lambda out, code=0: FMT[harness](out, code, False)  # noqa: E731
  return [
      {"role": "system", "content": "You are an autonomous agent ... reply with exactly one JSON object"},
      {"role": "user", "content": "Count the lines of /app/input.txt into /app/count.txt."},
      {"role": "assistant", "content": "I will look around first, let me think"},
      {"role": "tool", "content": A.format_error("no JSON object found. Reply with exactly one JSON object")},
      {"role": "assistant", "content": action(harness, "ls /app")},
      {"role": "tool", "content": obs("input.txt\n")},
      {"role": "assistant", "content": action(harness, "wc -l < /app/input.txt > /app/count.txt")},
      {"role": "user", "content": obs("") + "\n\n" + SUMMARY_REQUEST},
      {"role": "assistant", "content": "Summary: I listed /app and wrote the count; SECRET-SUMMARY-TEXT"},
      {"role": "user", "content": "Count the lines ... summary of your progress so far: ..."},
      {"role": "assistant", "content": action(harness, "cat /app/count.txt", done=True)},
      {"role": "tool", "content": "Turn 3/32\n" + obs("3\n")},
  ]


@pytest.mark.parametrize("harness", ["json", "xml"])
def test_strip_control_keeps_commands_and_observations_only(harness):
  steps = control_free_steps(transcript(harness), harness)
  assert [s.command for s in steps] == ["ls /app", "wc -l < /app/input.txt > /app/count.txt", "cat /app/count.txt"]
  assert [s.output for s in steps] == ["input.txt", "", "3"]
  assert [s.exit_code for s in steps] == [0, 0, 0]
  text = strip_control(transcript(harness), harness)
  assert text == ("$ ls /app\n[exit 0]\ninput.txt\n\n$ wc -l < /app/input.txt > /app/count.txt\n[exit 0]\n\n"
                  "$ cat /app/count.txt\n[exit 0]\n3\n")
  for control in ("Invalid action", "let me think", SUMMARY_REQUEST, "SECRET-SUMMARY-TEXT", "Turn 3/32",
                  "autonomous agent", "Count the lines", "<command>", '"command"', "exit_code"):
    assert control not in text


def test_strip_control_on_a_recorded_episode():
  """EpisodeResult.messages() (what the harness rendered) → the same steps, for both conventions."""
  def turn(i, kind, text, command=None, obs="", error=""):
    z = np.zeros(0, np.int32)
    return Turn(i, 0, kind, z, z, np.zeros(0, np.float32), "eos", 0, text=text, command=command,
                error=error, observation=obs)
  for h in ("json", "xml"):
    turns = [turn(0, TURN_ACTION, "oops", error="bad", obs=A.format_error("bad")),
             turn(1, TURN_ACTION, action(h, "echo hi"), "echo hi", FMT[h]("hi\n", 0, False)),
             turn(2, TURN_ACTION, action(h, "false"), "false", FMT[h]("", 1, False)),
             turn(3, TURN_SUMMARY, "summary text"),
             turn(4, TURN_ACTION, action(h, done=True))]
    r = EpisodeResult("t", "f", h, "run", "ep", verification_outcome(infra_error="x"), turns=turns)
    msgs = r.messages()
    assert msgs[5] == {"role": "user", "content": _summary_request(turns[2])}  # the observation rides along
    steps = control_free_steps(msgs, h)
    assert [(s.command, s.exit_code, s.output) for s in steps] == [("echo hi", 0, "hi"), ("false", 1, "")]


def test_strip_control_cuts_long_output_and_names_unknown_harness():
  long = [{"role": "assistant", "content": action("json", "cat big")},
          {"role": "tool", "content": FMT["json"]("a" * 500 + "b" * 500, 0, False)}]
  text = strip_control(long, "json", max_output_chars=100)
  assert "a" * 50 in text and "b" * 50 in text and "a" * 51 not in text and "900 characters cut" in text
  with pytest.raises(ValueError, match="unknown harness 'oracle'"):
    strip_control(long, "oracle")


def test_output_is_kept_as_it_was_under_every_harness():
  """Banner-like lines *inside* a command's output are output (only text around the wrapping is dropped):
  the same command and output give the same C(τ) under json and xml."""
  out = "Step 1/3\nattempt failed\nNew terminal output:\nTurns left: 2\n"
  texts = {h: strip_control([{"role": "assistant", "content": action(h, "./retry.sh")},
                             {"role": "tool", "content": "Turn 2/8\n" + FMT[h](out, 1, False) + "\nReminder"}], h)
           for h in ("json", "xml")}
  assert texts["json"] == texts["xml"] == "$ ./retry.sh\n[exit 1]\n" + out
