"""One episode: build → sandbox → agent → protected verifier → result.

:func:`run_episode` runs one task under one harness and never raises for infrastructure problems: a failed
build, a daemon error on create, a container that dies, a verifier that hangs or crashes all become an
:class:`EpisodeResult` with ``infra_failure=True`` and a ``failure_kind``, which training masks out and the
pool (:mod:`rsi_jax.env.pool`) counts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Mapping

from rsi_jax.env.dockerfiles import effective_image_map
from rsi_jax.env.harness import AgentRun, Harness, Segment, Turn
from rsi_jax.env.images import build_task_image, host_ca_bundle
from rsi_jax.env.sandbox import CREATE_FAILED, DOCKER_ERROR, DockerSandbox, SandboxError
from rsi_jax.env.tasks import Task, parse_memory
from rsi_jax.env.verifier import VerifierRun, verify
from rsi_jax.rl.ctrf import VerificationOutcome, verification_outcome

log = logging.getLogger(__name__)

NEEDS_INTERNET = "needs_internet"  # the task asks for the network the run does not give: refused, never scored
# the task's verifier fetches at test time (rsi_jax.env.verifier_deps) and builds have no network to fetch it
# beforehand: refused, never scored (its script would fail and score 0)
NEEDS_BUILD_NETWORK = "needs_build_network"
AGENT_ERROR = "agent_error"  # the harness or policy raised (not the agent's behaviour: masked, counted)
ABORTED = "aborted"  # stopped on purpose (oversampling: enough other episodes finished first)
# NEEDS_NETWORK (rsi_jax.env.verifier, which finds it in the test script's output): the tests needed the network
# and the container has none: never scored


class EpisodeAborted(Exception):
  """Raised by a policy to stop its episode on purpose: the container is removed, nothing is verified, and
  the episode is counted as aborted (not as an infrastructure failure)."""


@dataclasses.dataclass(frozen=True)
class EnvSettings:
  """What an episode needs from ``EnvConfig`` (see :meth:`from_config`)."""
  run_id: str = "dev"
  image_map: Mapping[str, str] = dataclasses.field(default_factory=lambda: effective_image_map({}))
  build_network: str = "host"
  network: str = "none"
  output_cap_bytes: int = 10_000
  command_timeout_s: float = 60.0
  agent_timeout_s: float | None = None  # None: the task's own
  verifier_timeout_s: float | None = None  # None: the task's own
  hygiene_patterns: tuple = ()
  pids_limit: int = 512  # unless the task sets its own
  disk_limit_bytes: int = 10 << 30  # what a container may write, unless the task sets environment.storage
  # a CA bundle task builds trust (builds with a network only); default: the host's
  build_ca_bundle: str | None = dataclasses.field(default_factory=host_ca_bundle)

  @classmethod
  def from_config(cls, cfg, run_id: str, hygiene_patterns=()) -> "EnvSettings":
    """From an ``EnvConfig``: the config's timeouts cap the tasks' own."""
    return cls(run_id=run_id, image_map=effective_image_map(cfg.image_map, cfg.base_image),
               build_network=cfg.build_network, pids_limit=cfg.pids_limit,
               disk_limit_bytes=parse_memory(cfg.disk_limit),
               build_ca_bundle=None if cfg.build_network == "none" or cfg.build_ca_bundle == "none"
               else (cfg.build_ca_bundle or host_ca_bundle()),
               network=cfg.network, output_cap_bytes=cfg.output_cap_bytes,
               command_timeout_s=cfg.command_timeout_s, agent_timeout_s=cfg.agent_timeout_s,
               verifier_timeout_s=cfg.verifier_timeout_s, hygiene_patterns=tuple(hygiene_patterns))


@dataclasses.dataclass
class EpisodeResult:
  task: str
  family: str
  harness: str
  run_id: str
  episode_id: str
  outcome: VerificationOutcome  # state ok / invalid_report / infra_failure, success S, passed P, total N
  turns: list[Turn] = dataclasses.field(default_factory=list)
  segments: list[Segment] = dataclasses.field(default_factory=list)
  stop_reason: str = ""
  failure_kind: str = ""  # "" or a sandbox / verifier / agent failure kind
  error: str = ""
  verifier_output: str = ""
  prompt_tokens: int = 0
  generated_tokens: int = 0
  build_s: float = 0.0
  start_s: float = 0.0  # container start latency
  agent_s: float = 0.0
  verify_s: float = 0.0
  total_s: float = 0.0
  endpoint: str = ""
  retried_from: tuple = ()  # endpoints whose daemon died under earlier runs of this episode (run again here)

  @property
  def infra_failure(self) -> bool:
    return self.outcome.state.value == "infra_failure"

  @property
  def success(self) -> int | None:
    return self.outcome.success

  def for_exchange(self) -> "EpisodeResult":
    """What a rollout step needs of this episode on other processes: its segments (the training samples), its
    outcome and records, and its turns without their prompts' token ids (:meth:`Turn.without_prompt`). Its size
    grows with the generated and observation tokens, not with turns x context as the prompts would."""
    return dataclasses.replace(self, turns=[t.without_prompt() for t in self.turns])

  def transcript(self) -> list[dict]:
    """The agent's interaction as chat messages without harness-control content (malformed-action errors,
    summary requests and summaries are left out): [{"role": "assistant" | "tool", "content": str}, ...].
    What RSR planning conditions on (C(τ), paper §2.1)."""
    out = []
    for t in self.turns:
      if t.kind != "action" or t.error:
        continue
      out.append({"role": "assistant", "content": t.text})
      if t.command is not None:
        out.append({"role": "tool", "content": t.observation})
    return out

  def messages(self) -> list[dict]:
    """The agent's side of the chat, harness-control messages included (malformed-action notices, summary
    requests, summaries): [{"role": "assistant" | "tool" | "user", "content": str}, ...], as the harness
    rendered them (the system prompt and the instruction are not repeated). What
    :func:`rsi_jax.rsr.strip_control` cleans and :func:`rsi_jax.rsr.screen_trajectory` screens."""
    from rsi_jax.env.harness import _summary_request
    out = []
    for i, t in enumerate(self.turns):
      if t.kind == "summary":  # the request carries the last observation (one user message)
        out.append({"role": "user", "content": _summary_request(self.turns[i - 1]) if i else ""})
        out.append({"role": "assistant", "content": t.text})
        continue
      out.append({"role": "assistant", "content": t.text})
      summary_next = i + 1 < len(self.turns) and self.turns[i + 1].kind == "summary"
      if (t.error or t.command is not None) and not summary_next:
        out.append({"role": "tool", "content": t.observation})
    return out

  def to_dict(self) -> dict:
    """A JSON-serializable record (no token arrays) for logs and trajectory tables."""
    d = self.summary()
    d.update(run_id=self.run_id, episode_id=self.episode_id, reason=self.outcome.reason, error=self.error,
             endpoint=self.endpoint, retried_from=list(self.retried_from), prompt_tokens=self.prompt_tokens,
             generated_tokens=self.generated_tokens,
             segments=len(self.segments), times={k: round(getattr(self, k), 3) for k in
                                                 ("build_s", "start_s", "agent_s", "verify_s", "total_s")},
             turns_detail=[{"kind": t.kind, "segment": t.segment, "text": t.text, "command": t.command,
                            "done": t.done, "error": t.error, "observation": t.observation,
                            "exit_code": t.exit_code, "timed_out": t.timed_out, "finish_reason": t.finish_reason,
                            "weight_version": t.weight_version, "prompt_len": int(t.prompt_len),
                            "sampled_len": int(len(t.sampled_ids))} for t in self.turns])
    return d

  def summary(self) -> dict:
    o = self.outcome
    return {"task": self.task, "family": self.family, "harness": self.harness, "state": o.state.value,
            "success": o.success, "passed": o.passed, "total": o.total, "stop": self.stop_reason,
            "failure_kind": self.failure_kind, "turns": len(self.turns), "total_s": round(self.total_s, 2)}


def run_episode(task: Task, harness: Harness, client, settings: EnvSettings, *, episode_id: str = "",
                endpoint: str = "", abort: threading.Event | None = None) -> EpisodeResult:
  """One episode of ``task`` under ``harness``; infrastructure failures are recorded, not raised. ``abort``: once
  set, the container is removed at once (a running agent command or verification ends with it) and the
  episode is counted as aborted."""
  t0 = time.time()
  episode_id = episode_id or uuid.uuid4().hex[:12]
  res = EpisodeResult(task.name, task.family, harness.name, settings.run_id, episode_id,
                      verification_outcome(infra_error="not run"), endpoint=endpoint)
  agent_timeout = min(task.agent_timeout_s, settings.agent_timeout_s or task.agent_timeout_s)
  verifier_timeout = min(task.verifier_timeout_s, settings.verifier_timeout_s or task.verifier_timeout_s)
  if task.allow_internet and settings.network == "none":
    res.failure_kind = NEEDS_INTERNET
    res.error = (f"{task.name} sets environment.allow_internet = true but env.network is 'none': refused "
                 f"(give the run a network, or leave the task out)")
    res.outcome = verification_outcome(infra_error=res.error)
    res.total_s = time.time() - t0
    return res
  if settings.build_network == "none":
    from rsi_jax.env.verifier_deps import fetches
    wants = fetches(task)
    if wants:
      res.failure_kind = NEEDS_BUILD_NETWORK
      res.error = (f"{task.name}: its verifier script fetches {', '.join(wants)} at test time, and with "
                   f"env.build_network 'none' the build cannot put them in the image: refused (set "
                   f"env.build_network: host)")
      res.outcome = verification_outcome(infra_error=res.error)
      res.total_s = time.time() - t0
      return res
  try:
    image = build_task_image(client, task, settings.image_map, network=settings.build_network,
                             ca_bundle=settings.build_ca_bundle)
    res.build_s = time.time() - t0
    box = DockerSandbox(client, image, run_id=settings.run_id, task_name=task.name, episode_id=episode_id,
                        cpus=task.cpus, memory_bytes=task.memory_bytes,
                        pids_limit=task.pids_limit or settings.pids_limit,
                        network=settings.network, output_cap_bytes=settings.output_cap_bytes,
                        command_timeout_s=settings.command_timeout_s,
                        disk_limit_bytes=task.storage_bytes or settings.disk_limit_bytes)
    with box, _removed_on(abort, box):
      res.start_s = box.start_latency_s or 0.0
      modes = hide_private(box, task)
      try:
        run: AgentRun = harness.run(box, task, deadline=time.time() + agent_timeout)
      except SandboxError:
        raise
      except EpisodeAborted as e:
        res.failure_kind, res.error = ABORTED, str(e)
        res.outcome = verification_outcome(infra_error=f"aborted: {e}")
        return res
      except Exception as e:  # noqa: BLE001 - a policy / harness bug must not take the pool down
        log.exception("%s: harness %s failed", task.name, harness.name)
        res.failure_kind, res.error = AGENT_ERROR, f"{type(e).__name__}: {e}"
        res.outcome = verification_outcome(infra_error=res.error)
        return res
      box.check_disk()  # what background writers left after the last command
      res.turns, res.segments, res.stop_reason = run.turns, run.segments, run.stop_reason
      res.prompt_tokens, res.generated_tokens, res.agent_s = run.prompt_tokens, run.generated_tokens, run.duration_s
      v: VerifierRun = verify(box, task, timeout_s=verifier_timeout, hygiene_patterns=settings.hygiene_patterns,
                              private_modes=modes)
      res.outcome, res.verifier_output, res.verify_s = v.outcome, v.output, v.duration_s
      res.failure_kind = v.failure_kind
      if v.tampered:
        res.error = f"tampered: {list(v.tampered[:5])}"
      elif v.failure_kind:  # the verifier's infrastructure failure (needs_network, verifier_error, ...): why
        res.error = v.outcome.reason
  except SandboxError as e:
    res.failure_kind, res.error = e.kind, str(e)
    res.outcome = verification_outcome(infra_error=str(e))
  except Exception as e:  # noqa: BLE001 - e.g. a docker-py / HTTP error outside SandboxError: keep the record
    log.exception("%s: episode failed", task.name)
    res.failure_kind, res.error = DOCKER_ERROR, f"{type(e).__name__}: {e}"
    res.outcome = verification_outcome(infra_error=res.error)
  finally:
    res.total_s = time.time() - t0
  if abort is not None and abort.is_set() and res.infra_failure and res.failure_kind != ABORTED:
    # what failed was the container the abort removed (a command or the verifier cut short)
    res.failure_kind, res.error = ABORTED, f"aborted (container removed; {res.failure_kind}: {res.error})"
    res.outcome = verification_outcome(infra_error=res.error)
  return res


# Argv: the private paths. Prints "<octal mode> <path>" for each (as the image has it), then removes them.
_HIDE_SCRIPT = r"""
/usr/bin/stat -c '%a %n' -- "$@" 2>/dev/null
/bin/rm -rf -- "$@"
"""


def hide_private(box: DockerSandbox, task: Task) -> dict[str, int]:
  """Remove the private files the build copied (TB1 ``task.private_in_image``) before the agent starts;
  returns {path: mode} as the image had them (the verifier puts them back with it)."""
  if not task.private_in_image:
    return {}
  paths = list(task.private_in_image)
  res = box.exec_raw(["/bin/bash", "-c", _HIDE_SCRIPT, "hide", *paths], timeout_s=60)
  if res.exit_code != 0:
    raise SandboxError(CREATE_FAILED, f"{task.name}: could not remove private files from the container: "
                                      f"{' '.join(res.output.split())[-300:]}")
  modes, wanted = {}, set(paths)
  for line in res.output.splitlines():
    mode, _, path = line.partition(" ")
    if path in wanted and mode.isdigit():
      modes[path] = int(mode, 8)
  return modes


@contextlib.contextmanager
def _removed_on(abort: threading.Event | None, box):
  """While the block runs, a set ``abort`` removes ``box``'s container at once (polled every 0.1 s)."""
  if abort is None:
    yield
    return
  done = threading.Event()

  def watch():
    while not done.is_set():
      if abort.wait(0.1):
        box.close()
        return
  t = threading.Thread(target=watch, name="abort-watch", daemon=True)
  t.start()
  try:
    yield
  finally:
    done.set()
    t.join()
