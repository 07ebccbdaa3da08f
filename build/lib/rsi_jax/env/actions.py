"""Action conventions of the agent harnesses: how a sampled reply becomes a shell command.

``json`` (the target harness H₀): exactly one JSON object per reply, optionally inside a ```json fence::

    {"command": "ls -la /app", "done": false}      run a command, then see its output
    {"command": "make test", "done": true}         run it, then finish
    {"done": true}                                 finish
    optional: "timeout": seconds (capped by the harness), "analysis": free text (ignored)

``xml`` (a complementary convention for RSR discovery, different surface form)::

    <command>ls -la /app</command>                 run a command
    <done/>  or  <done>true</done>                 finish (after the command, if both are given)

A reply that does not follow the convention raises :class:`ActionError`; the harness turns its message into
an error observation and the episode continues.
"""

from __future__ import annotations

import dataclasses
import json
import re


class ActionError(ValueError):
  """A malformed action; the message is shown to the agent."""


@dataclasses.dataclass(frozen=True)
class Action:
  command: str | None  # None: nothing to run
  done: bool = False
  timeout_s: float | None = None


JSON_EXAMPLE = '{"command": "ls -la", "done": false}'
XML_EXAMPLE = "<command>ls -la</command>"


def parse_json_action(text: str) -> Action:
  """The first JSON object in ``text`` that decodes, as an :class:`Action`."""
  obj = _first_json_object(text)
  if obj is None:
    raise ActionError(f"no JSON object found. Reply with exactly one JSON object, e.g. {JSON_EXAMPLE}")
  unknown = set(obj) - {"command", "done", "timeout", "analysis", "plan", "explanation"}
  if unknown:
    raise ActionError(f"unknown field(s) {sorted(unknown)}; use \"command\" and \"done\", e.g. {JSON_EXAMPLE}")
  command = obj.get("command")
  done = obj.get("done", False)
  if not isinstance(done, bool):
    raise ActionError(f"\"done\" must be true or false, got {done!r}")
  if command is not None and not isinstance(command, str):
    raise ActionError(f"\"command\" must be a string, got {type(command).__name__}")
  if command is not None and not command.strip():
    command = None
  if command is None and not done:
    raise ActionError(f"give a \"command\" to run or \"done\": true, e.g. {JSON_EXAMPLE}")
  timeout = obj.get("timeout")
  if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                              or timeout <= 0):
    raise ActionError(f"\"timeout\" must be a positive number of seconds, got {timeout!r}")
  return Action(command, done, float(timeout) if timeout is not None else None)


def _first_json_object(text: str) -> dict | None:
  dec = json.JSONDecoder()
  for m in re.finditer(r"\{", text):
    try:
      obj, _ = dec.raw_decode(text, m.start())
    except json.JSONDecodeError:
      continue
    if isinstance(obj, dict):
      return obj
  return None


_CMD = re.compile(r"<command>(.*?)</command>", re.DOTALL)
_DONE = re.compile(r"<done\s*/>|<done>\s*(true|yes|1)?\s*</done>", re.IGNORECASE)


def parse_xml_action(text: str) -> Action:
  """``<command>...</command>`` and/or ``<done/>``."""
  cmds = _CMD.findall(text)
  done = bool(_DONE.search(text))
  if len(cmds) > 1:
    raise ActionError("give one <command>...</command> per reply")
  if not cmds and not done:
    if "<command>" in text:
      raise ActionError("unterminated <command>: close it with </command>")
    raise ActionError(f"no action found. Reply with {XML_EXAMPLE}, or <done/> when the task is complete")
  command = cmds[0].strip() if cmds else None
  return Action(command or None, done)


def format_json_observation(output: str, exit_code: int, timed_out: bool) -> str:
  return json.dumps({"exit_code": exit_code, "timed_out": timed_out, "output": output}, ensure_ascii=False)


def format_xml_observation(output: str, exit_code: int, timed_out: bool) -> str:
  t = " timed_out=\"true\"" if timed_out else ""
  return f"<output exit_code=\"{exit_code}\"{t}>\n{output}</output>"


def format_error(message: str) -> str:
  return f"Invalid action: {message}"
