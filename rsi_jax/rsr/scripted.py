"""A TEST DOUBLE for the actor in the RSR funnel: :class:`ScriptedRSRPolicy`.

It stands behind the sampler's :class:`~rsi_jax.policy.Policy` interface where a model too small to solve
anything (the CPU smoke actor, unit tests) would leave the funnel empty. It reads each prompt (real Qwen3
tokenizer and chat format) and answers like a competent agent would:

* an agent prompt (``json`` or ``xml`` harness) with no runbook in it: the task's reference solution as one
  command in that harness's convention, then ``done``;
* an agent prompt that carries a runbook (fresh execution under private guidance): the commands of the
  runbook's ``## Steps``, then ``done``;
* a planning prompt: a runbook whose steps are the commands of the trajectory in the prompt (C(τ));
* a judge prompt: ``ACCEPT``; a summary request: a one-line summary.

Everything it writes is encoded with the real tokenizer and ends with the end-of-turn token (logprob 0:
the script is deterministic). Unlike a model it is not cut at ``max_new_tokens`` (a smoke config's limit is
sized for the tiny actor, not for a task's reference solution). Runs that use it say so in their console
and lineage.
"""

from __future__ import annotations

import json
import re

import numpy as np

from rsi_jax.env.harness import SUMMARY_REQUEST, oracle_commands
from rsi_jax.policy import FINISH_EOS, Completion, SamplingParams
from rsi_jax.rsr.runbook import write_runbook
from rsi_jax.rsr.shellwords import commands, sections

LABEL = "scripted policy (test double: reference solutions, runbooks written from them)"
PLAN_MARK = "You write runbooks"
JUDGE_MARK = "You review a runbook"
GUIDANCE_MARK = "Private guidance:"


class ScriptedRSRPolicy:
  def __init__(self, tokenizer, tasks, weight_version: int = 0):
    self.tok = tokenizer
    self.tasks = list(tasks)
    self.weight_version = weight_version

  def _task(self, text: str):
    hits = [t for t in self.tasks if t.instruction.strip() in text]
    if not hits:
      raise ValueError("ScriptedRSRPolicy: the prompt holds none of its tasks' instructions")
    return max(hits, key=lambda t: len(t.instruction))

  def reply(self, prompt: str) -> str:
    last_user = prompt.rsplit("<|im_start|>user", 1)[-1]
    if SUMMARY_REQUEST in last_user and "<|im_start|>assistant" not in last_user:
      return "Summary: the commands so far ran; the task is being finished."
    if JUDGE_MARK in prompt:
      return "ACCEPT\nThe runbook uses only public information."
    if PLAN_MARK in prompt:
      return self._runbook(prompt)
    xml = "<command>" in prompt.split("<|im_end|>", 1)[0]  # the system prompt names the convention
    acted = prompt.count("<|im_start|>assistant") - 1  # the last one is the generation prompt
    if acted > 0:
      return "<done/>" if xml else json.dumps({"done": True})
    if GUIDANCE_MARK in prompt:
      runbook = prompt.split(GUIDANCE_MARK, 1)[1]
      cmd = "\n".join(commands(sections(runbook).get("Steps", "")))
    else:
      cmd = oracle_commands(self._task(prompt))
    return f"<command>{cmd}</command>" if xml else json.dumps({"command": cmd, "done": False})

  def _runbook(self, prompt: str) -> str:
    task = self._task(prompt)
    before, after = _plan_template_around_transcript()
    trace = prompt.split(before, 1)[-1].split(after, 1)[0]
    cmds, cur = [], None
    for line in trace.splitlines():
      if line.startswith("$ ") and cur is None:
        cur = [line[2:]]
      elif cur is not None and re.fullmatch(r"\[(exit -?\d+|timed out)\]", line):
        cmds.append("\n".join(cur))
        cur = None
      elif cur is not None:
        cur.append(line)
    if cur is not None:
      cmds.append("\n".join(cur))
    return write_runbook(task.instruction.strip().splitlines()[0], cmds, _workdir(task))

  def generate(self, prompt_ids, params: SamplingParams) -> Completion:
    text = self.reply(self.tok.decode([int(i) for i in prompt_ids]))
    ids = self.tok.encode(text) + [self.tok.im_end_id]
    return Completion(np.asarray(ids, np.int32), np.zeros(len(ids), np.float32), FINISH_EOS,
                      self.weight_version, prompt_len=len(prompt_ids))


def _plan_template_around_transcript() -> tuple[str, str]:
  """The planning template's text just before and just after ``${transcript}`` (where C(τ) sits)."""
  from rsi_jax.config import RSRConfig
  from rsi_jax.rsr.runbook import load_template
  text = load_template(RSRConfig().plan_template).text
  head, tail = text.split("${transcript}", 1)
  return head[-40:], tail.split("$", 1)[0][:40]


def _workdir(task) -> str:
  from rsi_jax.rsr.facts import task_facts
  return task_facts(task).workdir
