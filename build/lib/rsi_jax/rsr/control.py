"""C(τ): a verified trajectory without its harness-control messages (paper §2.1, SPEC §5).

What the planner conditions on is what the agent *did* — the shell commands it ran and what they printed —
in one harness-neutral form, whatever convention (``json``, ``xml``) produced it. Removed: the system
prompt and the instruction (x_pub enters the planning prompt on its own), format reminders and malformed-
action notices together with the reply that caused them, summary requests and the summaries themselves,
each convention's wrapping (JSON objects, ``<command>`` / ``<output>`` tags) and anything a harness puts
around an observation's wrapping (turn banners, reminders). The command's output itself is kept as it was.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from rsi_jax.env import actions as A
from rsi_jax.env.harness import SUMMARY_REQUEST

PARSERS = {"json": A.parse_json_action, "xml": A.parse_xml_action}
ERROR_PREFIX = A.format_error("")  # "Invalid action: "
_XML_OUT = re.compile(r"<output exit_code=\"(-?\d+)\"( timed_out=\"true\")?>\n?(.*)</output>", re.DOTALL)


@dataclasses.dataclass
class Step:
  """One command the agent ran and what it saw."""
  command: str
  exit_code: int | None = None
  timed_out: bool = False
  output: str = ""


def control_free_steps(transcript: Sequence[Mapping[str, str]], harness: str) -> list[Step]:
  """The commands of ``transcript`` (chat messages ``{"role", "content"}`` as ``harness`` rendered them,
  e.g. :meth:`rsi_jax.env.EpisodeResult.messages`) with their observations, control content removed."""
  if harness not in PARSERS:
    raise ValueError(f"strip_control: unknown harness {harness!r} (known: {sorted(PARSERS)})")
  parse = PARSERS[harness]
  steps: list[Step] = []
  pending: Step | None = None  # the last command, waiting for its observation
  summary_next = False
  for m in transcript:
    role, content = m.get("role"), str(m.get("content", ""))
    if role == "system":
      continue
    if role == "user":
      if SUMMARY_REQUEST in content:  # the last observation may precede the request in the same message
        obs = content.split(SUMMARY_REQUEST)[0].strip()
        if pending is not None and obs:
          _observe(pending, obs, harness)
        pending, summary_next = None, True
      continue  # the instruction (public, given separately) or another harness message
    if role == "assistant":
      if summary_next:  # a summary: harness scaffolding, not an action
        summary_next = False
        continue
      pending = None
      try:
        action = parse(content)
      except A.ActionError:
        continue  # the format notice that follows is dropped too
      if action.command is not None:
        pending = Step(action.command)
        steps.append(pending)
      continue
    if role == "tool":
      if content.startswith(ERROR_PREFIX) or pending is None:
        continue
      _observe(pending, content, harness)
      pending = None
  return steps


def _observe(step: Step, content: str, harness: str):
  """The observation inside the convention's wrapping (a JSON object, an ``<output>`` element); text around
  it (banners, reminders) is harness scaffolding and dropped, the output itself is kept as it was."""
  if harness == "json":
    obs = A._first_json_object(content)
    if isinstance(obs, dict) and "output" in obs:
      step.exit_code, step.timed_out, out = obs.get("exit_code"), bool(obs.get("timed_out")), obs.get("output")
    else:
      out = content
  else:
    m = _XML_OUT.search(content)
    if m:
      step.exit_code, step.timed_out, out = int(m.group(1)), bool(m.group(2)), m.group(3)
    else:
      out = content
  step.output = str(out).strip("\n")


def render_steps(steps: Sequence[Step], max_output_chars: int = 2000) -> str:
  """The harness-neutral text of C(τ): ``$ command``, its exit status and its output (long output cut in
  the middle)."""
  parts = []
  for s in steps:
    out = s.output
    if len(out) > max_output_chars:
      half = max_output_chars // 2
      out = out[:half] + f"\n[... {len(out) - 2 * half} characters cut ...]\n" + out[-half:]
    status = "timed out" if s.timed_out else (f"exit {s.exit_code}" if s.exit_code is not None else "")
    parts.append(f"$ {s.command}\n" + (f"[{status}]\n" if status else "") + (out + "\n" if out else ""))
  return "\n".join(parts)


def strip_control(transcript: Sequence[Mapping[str, str]], harness: str, max_output_chars: int = 2000) -> str:
  """C(τ): the commands the agent ran and their observations, as harness-neutral text."""
  return render_steps(control_free_steps(transcript, harness), max_output_chars)
