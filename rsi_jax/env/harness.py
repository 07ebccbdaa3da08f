"""Agent harnesses: the loop between a :class:`rsi_jax.policy.Policy` and a sandbox (SPEC §6, paper §2.1).

Token-in, token-out. The prompt of turn k+1 is built from ids, never from re-tokenized text::

    prompt_{k+1} = prompt_k + sampled_k + close_turn(sampled_k) + render(observation_k) + generation_prompt

so every turn's record (exact prompt ids, sampled ids, sampler logprobs, finish reason, weight version) lines
up with one linear token sequence per *segment*. When the next prompt would exceed
``summarize_threshold_tokens`` the harness asks the model for a summary of its progress (recorded as a turn
of the old segment) and starts a new linear segment whose prompt is the system prompt, the instruction and
that summary. Summarization is not a terminal event; each segment is its own training sample (sharing the
episode id).

Harnesses:

* :class:`JsonHarness` (``json``, the target harness H₀): JSON actions, see :mod:`rsi_jax.env.actions`;
* :class:`XmlHarness` (``xml``): XML-tag actions and observations, a different convention for RSR discovery;
* :class:`OracleHarness` (``oracle``): runs the task's reference solution (tests and bootstrapping).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rsi_jax.env import actions as A
from rsi_jax.env.sandbox import DockerSandbox
from rsi_jax.env.tasks import LAYOUT_HARBOR, Task
from rsi_jax.policy import (FINISH_EOS, FINISH_LENGTH, FINISH_REJECTED, Completion, Policy,
                            SamplingParams)

log = logging.getLogger(__name__)

# Why the agent phase ended.
STOP_DONE = "done"  # the agent declared completion
STOP_MAX_TURNS = "max_turns"
STOP_AGENT_TIMEOUT = "agent_timeout"
STOP_CONTEXT = "context_exhausted"  # the sampler rejected the prompt as too long
STOP_ORACLE = "oracle"

TURN_ACTION = "action"
TURN_SUMMARY = "summary"


@dataclasses.dataclass
class Turn:
  """One policy call and what the harness did with it."""
  index: int  # turn number within the episode (0-based, over all segments)
  segment: int
  kind: str  # TURN_ACTION | TURN_SUMMARY
  prompt_ids: np.ndarray  # (P,) int32: the exact prompt sent to the sampler
  sampled_ids: np.ndarray  # (n,) int32
  logprobs: np.ndarray  # (n,) float32, sampler log-probabilities
  finish_reason: str
  weight_version: int
  version_changed: bool = False  # a weight swap happened while this turn was sampled (sampler "mark" policy)
  text: str = ""  # decoded sampled ids (for logs and parsing only)
  command: str | None = None
  done: bool = False
  error: str = ""  # malformed-action message shown to the agent
  observation: str = ""
  exit_code: int | None = None
  timed_out: bool = False
  duration_s: float = 0.0
  prompt_len: int | None = None  # len(prompt_ids); kept when the ids are dropped (:meth:`without_prompt`)

  def __post_init__(self):
    if self.prompt_len is None:
      self.prompt_len = int(len(self.prompt_ids))

  def without_prompt(self) -> "Turn":
    """This turn without its prompt's token ids (they repeat every earlier turn: O(turns x T) per episode),
    its length kept. What leaves the process that ran the episode (the segments hold every trained token)."""
    return dataclasses.replace(self, prompt_ids=np.zeros(0, np.int32))


@dataclasses.dataclass
class Segment:
  """One linear token sequence (a training sample): the final prompt plus the last completion."""
  index: int
  ids: np.ndarray  # (T,) int32
  gen_mask: np.ndarray  # (T,) bool: 1 on sampled tokens
  logprobs: np.ndarray  # (T,) float32: sampler logprob on sampled tokens, 0 elsewhere
  turn_ids: np.ndarray  # (T,) int32: the turn that produced / preceded each token (-1: initial prompt)
  weight_versions: np.ndarray  # (T,) int32: weight version on sampled tokens, -1 elsewhere


@dataclasses.dataclass
class AgentRun:
  turns: list[Turn]
  segments: list[Segment]
  stop_reason: str
  prompt_tokens: int = 0  # summed over policy calls
  generated_tokens: int = 0
  duration_s: float = 0.0


class Harness:
  name = "base"

  def run(self, sandbox: DockerSandbox, task: Task, deadline: float) -> AgentRun:
    raise NotImplementedError

  @staticmethod
  def refusal(task: Task) -> str | None:
    """Why this harness cannot run ``task`` at all (a refusal before any episode), or None."""
    return None


class OracleHarness(Harness):
  """Runs the reference solution (``solution/solve.sh`` or ``solution.sh``) from the working directory."""
  name = "oracle"

  @staticmethod
  def refusal(task: Task) -> str | None:
    if task.solution is None:
      where = "solution/solve.sh" if task.layout == LAYOUT_HARBOR else "solution.sh"
      return f"no reference solution ({where}) for the oracle harness to run"
    return None

  def run(self, sandbox, task, deadline):
    t0 = time.time()
    why = self.refusal(task)
    if why:
      raise FileNotFoundError(f"{task.name}: {why}")
    src = task.solution.parent if task.solution.name == "solve.sh" else None
    if src is not None:
      sandbox.put_dir(src, "/oracle")
      script = "/oracle/solve.sh"
    else:
      sandbox.put_files({"/oracle/solution.sh": task.solution}, mode=0o755)
      script = "/oracle/solution.sh"
    budget = max(1.0, deadline - time.time())
    res = sandbox.run(f"bash {script}", timeout_s=budget)
    turn = Turn(0, 0, TURN_ACTION, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float32),
                FINISH_EOS, -1, command=f"bash {script}", done=True, observation=res.output,
                exit_code=res.exit_code, timed_out=res.timed_out, duration_s=res.duration_s)
    stop = STOP_AGENT_TIMEOUT if res.timed_out and time.time() >= deadline else STOP_ORACLE
    return AgentRun([turn], [], stop, duration_s=time.time() - t0)


JSON_SYSTEM = """You are an autonomous agent solving a task in a Linux terminal (bash as root, working \
directory /app, no network access).
Reply with exactly one JSON object per turn:
  {{"command": "<a bash command>", "done": false}}
The command runs in a persistent shell (the working directory and exported variables carry over between \
commands); you then see its exit code and output (output over {cap} bytes is cut in the middle). Commands \
that run longer than {timeout:g} s are killed.
When the task is complete, reply {{"done": true}} (a "command" given together with "done": true runs first).
You have at most {turns} turns."""

XML_SYSTEM = """You are an autonomous agent working in a Linux terminal (bash as root, working directory \
/app, no network access).
To run a shell command, reply with <command>the command</command>. The shell keeps its working directory and \
exported variables between commands. You will see <output exit_code="N">...</output> (long output is cut in \
the middle; commands longer than {timeout:g} s are killed).
When you have finished the task, reply <done/> (you may put one <command> before it).
At most {turns} turns."""

SUMMARY_REQUEST = ("Your context is nearly full. Summarize your progress on the task so far: what you found, "
                   "what you changed (files, commands), what remains to be done. Reply with the summary only, "
                   "no action.")


class ChatHarness(Harness):
  """A token-in/token-out chat loop; subclasses fix the action convention."""
  name = "chat"
  system_template = JSON_SYSTEM

  def __init__(self, policy: Policy, renderer, sampling: SamplingParams, *, max_turns: int = 32,
               command_timeout_s: float = 60.0, summarize_threshold_tokens: int = 32_000,
               output_cap_bytes: int = 10_000, max_summaries: int = 8, guidance=None):
    self.policy = policy
    # Private guidance (RSR fresh execution: I_exec ⊕ x_pub ⊕ b): a function task -> the user message that
    # replaces the public instruction in every segment's initial prompt. None: the public instruction.
    self.guidance = guidance
    self.renderer = renderer
    self.sampling = sampling
    self.max_turns = max_turns
    self.command_timeout_s = command_timeout_s
    self.summarize_threshold_tokens = summarize_threshold_tokens
    self.output_cap_bytes = output_cap_bytes
    self.max_summaries = max_summaries

  # -- convention (overridden)

  def parse(self, text: str) -> A.Action:
    return A.parse_json_action(text)

  def format_observation(self, output: str, exit_code: int, timed_out: bool) -> str:
    return A.format_json_observation(output, exit_code, timed_out)

  def system_prompt(self) -> str:
    return self.system_template.format(cap=self.output_cap_bytes, timeout=self.command_timeout_s,
                                       turns=self.max_turns)

  # -- loop

  def initial_prompt(self, task: Task, summary: str | None = None, private: bool = True) -> list[int]:
    """The first prompt of a segment: system prompt, the instruction (or, with ``private`` and a
    ``guidance``, the private guidance), the summary of earlier segments if any."""
    user = self.guidance(task).strip() if private and self.guidance is not None else task.instruction.strip()
    if summary is not None:
      user += "\n\nYou already worked on this task; summary of your progress so far:\n" + summary.strip()
    return self.prompt_for(user)

  def prompt_for(self, user: str) -> list[int]:
    """The harness's prompt for one user message: its system prompt, the message, the generation prompt."""
    msgs = [{"role": "system", "content": self.system_prompt()}, {"role": "user", "content": user}]
    return [int(i) for i in self.renderer.render(msgs, add_generation_prompt=True).ids]

  def _generate(self, prompt: list[int]) -> Completion:
    return self.policy.generate(prompt, self.sampling)

  def run(self, sandbox, task, deadline):
    t0 = time.time()
    turns: list[Turn] = []
    segments: list[Segment] = []
    prompt = self.initial_prompt(task)
    seg_turns: list[Turn] = []
    seg, n_prompt, n_gen, summaries = 0, 0, 0, 0
    stop = STOP_MAX_TURNS
    while len([t for t in turns if t.kind == TURN_ACTION]) < self.max_turns:
      if time.time() >= deadline:
        stop = STOP_AGENT_TIMEOUT
        break
      comp = self._generate(prompt)
      n_prompt += len(prompt)
      n_gen += len(comp.token_ids)
      turn = self._record(len(turns), seg, TURN_ACTION, prompt, comp)
      turns.append(turn)
      seg_turns.append(turn)
      if comp.finish_reason == FINISH_REJECTED:
        stop = STOP_CONTEXT
        break
      if comp.finish_reason == FINISH_LENGTH and not turn.text.strip():
        turn.error = "empty reply"
      self._act(sandbox, turn, deadline)
      if turn.done:
        stop = STOP_DONE
        break
      if time.time() >= deadline:
        stop = STOP_AGENT_TIMEOUT
        break
      nxt = (prompt + [int(i) for i in comp.token_ids] + self.renderer.close_turn(comp.token_ids)
             + self.renderer.render_message("tool", turn.observation) + self.renderer.generation_prompt())
      actions_left = self.max_turns - sum(t.kind == TURN_ACTION for t in turns)
      if len(nxt) > self.summarize_threshold_tokens and summaries < self.max_summaries and actions_left > 0:
        # Proactive summarization: a new linear segment, not the end of the episode (only when another action
        # follows: a summary nobody acts on would take the episode's terminal reward).
        req = (prompt + [int(i) for i in comp.token_ids] + self.renderer.close_turn(comp.token_ids)
               + self.renderer.render_message("user", _summary_request(turn))
               + self.renderer.generation_prompt())
        scomp = self._generate(req)
        n_prompt += len(req)
        n_gen += len(scomp.token_ids)
        sturn = self._record(len(turns), seg, TURN_SUMMARY, req, scomp)
        turns.append(sturn)
        seg_turns.append(sturn)
        if scomp.finish_reason == FINISH_REJECTED:  # not even the summary request fits
          stop = STOP_CONTEXT
          break
        segments.append(build_segment(seg, seg_turns))
        seg, seg_turns, summaries = seg + 1, [], summaries + 1
        prompt = self.initial_prompt(task, summary=sturn.text)
      else:
        prompt = nxt
    if seg_turns:
      segments.append(build_segment(seg, seg_turns))
    return AgentRun(turns, segments, stop, n_prompt, n_gen, time.time() - t0)

  def _record(self, index, seg, kind, prompt, comp: Completion) -> Turn:
    ids = np.asarray(comp.token_ids, np.int32)
    text = self.renderer.decode([i for i in ids.tolist() if i not in self.renderer.eos_ids])
    return Turn(index, seg, kind, np.asarray(prompt, np.int32), ids, np.asarray(comp.logprobs, np.float32),
                comp.finish_reason, int(comp.weight_version), bool(comp.version_changed), text=text)

  def _act(self, sandbox, turn: Turn, deadline: float):
    if turn.error:
      turn.observation = A.format_error(turn.error)
      return
    try:
      action = self.parse(turn.text)
    except A.ActionError as e:
      turn.error = str(e)
      turn.observation = A.format_error(turn.error)
      return
    turn.command, turn.done = action.command, action.done
    if action.command is None:
      return
    budget = min(action.timeout_s or self.command_timeout_s, self.command_timeout_s,
                 max(1.0, deadline - time.time()))
    res = sandbox.run(action.command, timeout_s=budget)
    turn.exit_code, turn.timed_out, turn.duration_s = res.exit_code, res.timed_out, res.duration_s
    turn.observation = self.format_observation(res.output, res.exit_code, res.timed_out)


def _summary_request(turn: Turn) -> str:
  """The last observation, then the request to summarize (one user message)."""
  return (turn.observation + "\n\n" if turn.observation else "") + SUMMARY_REQUEST


class JsonHarness(ChatHarness):
  name = "json"
  system_template = JSON_SYSTEM


class XmlHarness(ChatHarness):
  name = "xml"
  system_template = XML_SYSTEM

  def parse(self, text):
    return A.parse_xml_action(text)

  def format_observation(self, output, exit_code, timed_out):
    return A.format_xml_observation(output, exit_code, timed_out)


HARNESSES = {"json": JsonHarness, "xml": XmlHarness, "oracle": OracleHarness}


def make_harness(name: str, policy: Policy | None = None, renderer=None,
                 sampling: SamplingParams | None = None, env_cfg=None, guidance=None) -> Harness:
  """A harness by name (``json`` | ``xml`` | ``oracle``), configured from an ``EnvConfig``; ``guidance``:
  see :class:`ChatHarness`."""
  if name not in HARNESSES:
    raise ValueError(f"unknown harness {name!r} (known: {sorted(HARNESSES)})")
  if name == "oracle":
    return OracleHarness()
  if policy is None or renderer is None:
    raise ValueError(f"harness {name!r} needs a policy and a chat renderer")
  kw = {}
  if env_cfg is not None:
    kw = dict(max_turns=env_cfg.max_turns, command_timeout_s=env_cfg.command_timeout_s,
              summarize_threshold_tokens=summarize_threshold(env_cfg.summarize_threshold_tokens, policy),
              output_cap_bytes=env_cfg.output_cap_bytes)
  return HARNESSES[name](policy, renderer, sampling or SamplingParams(), guidance=guidance, **kw)


_LOWERED: set[tuple[int, int]] = set()  # (threshold, prompt limit) pairs summarize_threshold has logged


def summarize_threshold(threshold: int, policy) -> int:
  """The summarization threshold a harness can actually reach with ``policy``.

  A policy that rejects prompts over ``max_prompt_tokens`` (the sampler's prefill limit) would end the
  episode with ``context_exhausted`` before a larger threshold triggers, so the threshold is lowered to
  leave room for the summary request itself (a quarter of the limit, at most 512 tokens)."""
  limit = getattr(policy, "max_prompt_tokens", None)
  if not limit:
    return threshold
  reachable = max(1, int(limit) - min(512, int(limit) // 4))
  if reachable < threshold and (threshold, int(limit)) not in _LOWERED:  # said once, not once per harness
    _LOWERED.add((threshold, int(limit)))
    log.info("summarization threshold %d lowered to %d: the policy accepts prompts of at most %d tokens",
             threshold, reachable, limit)
  return min(threshold, reachable)


def single_turn_segment(prompt_ids, comp: Completion) -> Segment:
  """Segment 0 of one action turn: a prompt and its completion, recorded as the harness records a turn
  (token-in, token-out)."""
  turn = Turn(0, 0, TURN_ACTION, np.asarray(prompt_ids, np.int32), np.asarray(comp.token_ids, np.int32),
              np.asarray(comp.logprobs, np.float32), comp.finish_reason, comp.weight_version)
  return build_segment(0, [turn])


def build_segment(index: int, turns: Sequence[Turn]) -> Segment:
  """The segment's linear sequence: the last turn's prompt + its sampled ids, with masks and per-token
  records. Every earlier turn's sampled ids sit inside the last prompt at known offsets (token-in,
  token-out), which is checked here."""
  last = turns[-1]
  ids = np.concatenate([last.prompt_ids, last.sampled_ids]).astype(np.int32)
  T = len(ids)
  gen = np.zeros(T, bool)
  lp = np.zeros(T, np.float32)
  tid = np.full(T, -1, np.int32)
  wv = np.full(T, -1, np.int32)
  prev_end, prev_index = 0, -1
  for t in turns:
    start = len(t.prompt_ids)
    end = start + len(t.sampled_ids)
    if not np.array_equal(ids[start:end], t.sampled_ids) or not np.array_equal(ids[:start], t.prompt_ids):
      raise AssertionError(f"turn {t.index}: history is not linear")
    tid[prev_end:start] = prev_index  # the observation that followed the previous turn
    gen[start:end] = True
    lp[start:end] = t.logprobs
    tid[start:end] = t.index
    wv[start:end] = t.weight_version
    prev_end, prev_index = end, t.index
  return Segment(index, ids, gen, lp, tid, wv)


# ------------------------------------------------------------------------------------- scripted policy


class ScriptedPolicy:
  """A real policy that replies with fixed texts, encoded with the real tokenizer and ended with the
  end-of-turn token (logprob 0: the script is deterministic). For tests, benchmarks and bootstrapping.

  ``replies``: the texts of successive turns; after the last one it repeats ``default``."""

  def __init__(self, tokenizer, replies: Sequence[str], default: str = '{"done": true}',
               weight_version: int = 0):
    self.tok = tokenizer
    self.replies = list(replies)
    self.default = default
    self.weight_version = weight_version
    self.calls: list[list[int]] = []

  def generate(self, prompt_ids, params: SamplingParams) -> Completion:
    self.calls.append([int(i) for i in prompt_ids])
    text = self.replies[len(self.calls) - 1] if len(self.calls) <= len(self.replies) else self.default
    ids = self.tok.encode(text)[:params.max_new_tokens]
    reason = FINISH_LENGTH
    if len(ids) < params.max_new_tokens:
      ids = ids + [self.tok.im_end_id]
      reason = FINISH_EOS
    return Completion(np.asarray(ids, np.int32), np.zeros(len(ids), np.float32), reason,
                      self.weight_version, prompt_len=len(prompt_ids))


def oracle_commands(task: Task) -> str:
  """The reference solution as one shell command (for a scripted policy replaying it), without its ``#!``
  line (a comment to the shell that runs the command; as a demonstration it is only noise)."""
  if task.solution is None:
    raise FileNotFoundError(f"{task.name}: no reference solution")
  text = Path(task.solution).read_text()
  return text.split("\n", 1)[1] if text.startswith("#!") and "\n" in text else text
