"""Episodes and the environment pool: build → sandbox → agent → protected verifier → result.

:func:`run_episode` runs one task under one harness and never raises for infrastructure problems: a failed
build, a daemon error on create, a container that dies, a verifier that hangs or crashes all become an
:class:`EpisodeResult` with ``infra_failure=True`` and a ``failure_kind``, which training masks out and the
pool counts. :class:`EnvPool` runs many episodes concurrently (a thread per running episode, at most
``concurrency``) across one or more Docker endpoints, each episode on the least-loaded live endpoint.

Endpoint health: an episode that ends as an infrastructure failure on an endpoint whose daemon no longer
answers a ``ping`` (connection refused, socket gone, no answer) takes that endpoint out of rotation and is
run again on a live one (``counts["infra_failures.retried"]``); a failure on an endpoint that still answers
(a bad Dockerfile, a verifier that hangs) is the task's own and is kept. A down endpoint is probed again with
back-off (1 s doubling to 30 s) and put back when it answers, after the containers its lost episodes left
there are removed. While every endpoint is down, episodes wait up to ``env.endpoint_wait_s`` for one to come
back, then raise :class:`AllEndpointsDown`.
"""

from __future__ import annotations

import collections
import contextlib
import concurrent.futures as cf
import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

from rsi_jax.env.dockerfiles import effective_image_map
from rsi_jax.env.harness import AgentRun, Harness, Segment, Turn
from rsi_jax.env.images import build_task_image, host_ca_bundle
from rsi_jax.env.reaper import LABEL_HOST, LABEL_PID, LABEL_RUN, install_signal_handlers, reap_orphans
from rsi_jax.env.sandbox import CREATE_FAILED, DOCKER_ERROR, DockerSandbox, SandboxError, docker_client
from rsi_jax.env.tasks import Task, parse_memory
from rsi_jax.env.verifier import NEEDS_NETWORK, VerifierRun, verify
from rsi_jax.rl.ctrf import VerificationOutcome, verification_outcome

log = logging.getLogger(__name__)

NEEDS_INTERNET = "needs_internet"  # the task asks for the network the run does not give: refused, never scored
# the task's verifier fetches at test time (rsi_jax.env.verifier_deps) and builds have no network to fetch it
# beforehand: refused, never scored (its script would fail and score 0)
NEEDS_BUILD_NETWORK = "needs_build_network"
AGENT_ERROR = "agent_error"  # the harness or policy raised (not the agent's behaviour: masked, counted)
ABORTED = "aborted"  # stopped on purpose (oversampling: enough other episodes finished first)
# NEEDS_NETWORK (imported above from rsi_jax.env.verifier, which finds it in the test script's output): the tests
# needed the network and the container has none: never scored


# not retried on another endpoint: refusals and stops that say nothing about the endpoint
_NOT_RETRIED = (NEEDS_INTERNET, NEEDS_BUILD_NETWORK, NEEDS_NETWORK, ABORTED)
MAX_ENDPOINT_RETRIES = 3  # runs of one episode ended by a dead endpoint before its failure is kept
PROBE_TIMEOUT_S = 5.0  # a ping that takes longer counts as no answer


class AllEndpointsDown(RuntimeError):
  """Every Docker endpoint of the pool stayed down for ``env.endpoint_wait_s`` (raised from the episode's
  future: :meth:`EnvPool.run` raises it), or none answered when the pool was made. One line naming each
  endpoint and why it is down."""


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
                            "weight_version": t.weight_version, "prompt_len": int(len(t.prompt_ids)),
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


def _endpoint_name(h: str) -> str:
  return h or "local"


def _why_down(e: BaseException | str) -> str:
  """One short line saying why an endpoint did not answer."""
  text = str(e)
  low = text.lower()
  if "no such file or directory" in low or "filenotfounderror" in low:
    return "socket missing"
  if "connection refused" in low:
    return "connection refused"
  if "timed out" in low or "timeout" in low:
    return "no answer"
  if isinstance(e, BaseException) and not text:
    return type(e).__name__
  return " ".join(text.split())[:160]


@dataclasses.dataclass
class _Down:
  """An endpoint out of rotation: since when (wall clock), why, and when it is probed next (monotonic)."""
  since: float
  reason: str
  delay_s: float
  next_probe: float


class EnvPool:
  """Concurrent episodes over one or more Docker endpoints.

  ``hosts``: endpoint URLs (``unix://...``, ``tcp://host:2375``, ``ssh://...``); empty = the local daemon.
  ``concurrency``: episodes running at once, over all endpoints. ``endpoint_wait_s``: how long an episode
  waits for an endpoint while every endpoint is down (then :class:`AllEndpointsDown`). ``probe_min_s`` /
  ``probe_max_s``: the back-off of the probes of a down endpoint.

  ``counts``: ``episodes``, ``aborted``, ``infra_failures`` (episodes whose result is an infrastructure
  failure), ``infra:<failure kind>``, and ``infra_failures.retried`` (runs ended by a dead endpoint and run
  again elsewhere; not episodes). ``events``: the latest (wall time, "attempt" | "down" | "up", endpoint,
  episode id or reason) records."""

  def __init__(self, settings: EnvSettings, *, hosts: Sequence[str] = (), concurrency: int = 4,
               reap: bool = True, endpoint_wait_s: float = 120.0, probe_min_s: float = 1.0,
               probe_max_s: float = 30.0):
    install_signal_handlers()
    self.settings = settings
    self.hosts = list(dict.fromkeys(hosts)) or [""]
    self.concurrency = concurrency
    self.endpoint_wait_s = float(endpoint_wait_s)
    self.probe_min_s, self.probe_max_s = float(probe_min_s), float(probe_max_s)
    self._pool_size = max(16, 2 * concurrency)
    self._load = {h: 0 for h in self.hosts}
    self._lock = threading.Lock()
    self._cv = threading.Condition(self._lock)
    self._down: dict[str, _Down] = {}
    self._prober: threading.Thread | None = None
    self._closed = False
    self.counts = collections.Counter()  # episodes, infra failures by kind, retried runs
    self.events = collections.deque(maxlen=10_000)
    self.clients: dict = {}
    errors = {}
    for h in self.hosts:
      try:
        self.clients[h] = docker_client(h or None, pool_size=self._pool_size)
      except SandboxError as e:
        self.clients[h], errors[h] = None, e
    if len(errors) == len(self.hosts):
      raise AllEndpointsDown("no Docker endpoint answers: " + "; ".join(
          f"{_endpoint_name(h)}: {_why_down(e)}" for h, e in errors.items()))
    for h, e in errors.items():
      self._mark_down(h, _why_down(e))
    if reap:
      for c in self.clients.values():
        if c is not None:
          reap_orphans(c)
    self._executor = cf.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="env")

  @classmethod
  def from_config(cls, cfg, run_id: str, hygiene_patterns=()) -> "EnvPool":
    """From an ``EnvConfig`` (``docker_hosts``, ``concurrency``, ``endpoint_wait_s`` and the episode
    settings)."""
    return cls(EnvSettings.from_config(cfg, run_id, hygiene_patterns), hosts=cfg.docker_hosts,
               concurrency=cfg.concurrency, endpoint_wait_s=cfg.endpoint_wait_s)

  # ------------------------------------------------------------------------------------ endpoint health

  def endpoint_status(self) -> dict:
    """{endpoint: {"up": bool, "load": running episodes, "reason": why down, "down_s": for how long}}."""
    with self._lock:
      now = time.time()
      return {h: {"up": h not in self._down, "load": self._load[h],
                  "reason": self._down[h].reason if h in self._down else "",
                  "down_s": now - self._down[h].since if h in self._down else 0.0} for h in self.hosts}

  def _ping(self, h: str) -> str | None:
    """None when ``h`` answers a ping within PROBE_TIMEOUT_S, else why not."""
    try:
      docker_client(h or None, timeout_s=PROBE_TIMEOUT_S, pool_size=2).ping()
      return None
    except Exception as e:  # noqa: BLE001 - any failure to answer: connection, HTTP, API
      return _why_down(e)

  def _mark_down(self, h: str, reason: str):
    with self._cv:
      if h in self._down or self._closed:
        return
      self._down[h] = _Down(time.time(), reason, self.probe_min_s, time.monotonic() + self.probe_min_s)
      self.events.append((time.time(), "down", h, reason))
      up = [_endpoint_name(x) for x in self.hosts if x not in self._down]
      log.warning("Docker endpoint %s is down (%s): out of rotation, probed again with back-off; live: %s",
                  _endpoint_name(h), reason, ", ".join(up) or "none")
      if self._prober is None:
        self._prober = threading.Thread(target=self._probe_loop, name="env-probe", daemon=True)
        self._prober.start()
      self._cv.notify_all()  # a prober waiting for a later probe of another endpoint

  def _probe_loop(self):
    while True:
      with self._cv:
        if self._closed or not self._down:
          self._prober = None
          return
        now = time.monotonic()
        due = [h for h, d in self._down.items() if d.next_probe <= now]
        if not due:
          self._cv.wait(min(d.next_probe for d in self._down.values()) - now)
          continue
      for h in due:
        why = self._ping(h)
        if why is None:
          why = self._rejoin(h)
        with self._cv:
          d = self._down.get(h)
          if d is None:
            continue
          if why is None:
            del self._down[h]
            self.events.append((time.time(), "up", h, ""))
            log.warning("Docker endpoint %s answers again after %.0f s: back in rotation", _endpoint_name(h),
                        time.time() - d.since)
            self._cv.notify_all()
          else:
            d.reason, d.delay_s = why, min(2 * d.delay_s, self.probe_max_s)
            d.next_probe = time.monotonic() + d.delay_s

  def _rejoin(self, h: str) -> str | None:
    """Before ``h`` is back in rotation: its client, and the containers of this run's lost episodes there
    (stopped with the daemon, left behind) removed. None, or why it cannot rejoin yet."""
    from rsi_jax.env.reaper import _LIVE, _LIVE_LOCK
    try:
      c = self.clients.get(h) or docker_client(h or None, pool_size=self._pool_size)
      self.clients[h] = c
      filters = {"label": [f"{LABEL_RUN}={self.settings.run_id}", f"{LABEL_HOST}={socket.gethostname()}",
                           f"{LABEL_PID}={os.getpid()}"]}
      for box in c.containers.list(all=True, filters=filters, ignore_removed=True):
        with _LIVE_LOCK:
          live = box.id in _LIVE
        if not live:
          box.remove(force=True)
    except Exception as e:  # noqa: BLE001 - not back yet
      return _why_down(e)
    return None

  def _endpoint_died(self, h: str) -> bool:
    """Whether ``h`` is down (it is marked so when it no longer answers)."""
    with self._lock:
      if h in self._down:
        return True
    why = self._ping(h)
    if why is None:
      return False
    self._mark_down(h, why)
    return True

  def _down_message(self, waited_s: float) -> str:
    now = time.time()
    parts = [f"{_endpoint_name(h)} ({self._down[h].reason}, down {now - self._down[h].since:.0f} s)"
             for h in self.hosts if h in self._down]
    return (f"every Docker endpoint is down, none came back within env.endpoint_wait_s={self.endpoint_wait_s:g} s "
            f"(waited {waited_s:.0f} s): " + "; ".join(parts))

  # ------------------------------------------------------------------------------------------- episodes

  def _acquire(self, episode_id: str = "") -> str:
    """The least-loaded live endpoint; while none is live, wait up to ``endpoint_wait_s``."""
    t0 = None
    with self._cv:
      while True:
        if self._closed:
          raise RuntimeError("EnvPool closed while an episode waited for a Docker endpoint")
        up = [h for h in self.hosts if h not in self._down]
        if up:
          h = min(up, key=lambda x: self._load[x])
          self._load[h] += 1
          self.events.append((time.time(), "attempt", h, episode_id))
          return h
        now = time.monotonic()
        if t0 is None:
          t0 = now
          log.warning("every Docker endpoint is down: episode %s waits up to %g s", episode_id,
                      self.endpoint_wait_s)
        if now - t0 >= self.endpoint_wait_s:
          raise AllEndpointsDown(self._down_message(now - t0))
        self._cv.wait(self.endpoint_wait_s - (now - t0))

  def _release(self, h: str):
    with self._cv:
      self._load[h] -= 1

  def _one(self, task: Task, harness: Harness, episode_id: str, abort: threading.Event | None) -> EpisodeResult:
    retried_from: list[str] = []
    while True:
      h = self._acquire(episode_id)
      try:
        try:
          r = run_episode(task, harness, self.clients[h], self.settings, episode_id=episode_id, endpoint=h,
                          abort=abort)
        except Exception as e:  # noqa: BLE001 - keep the pool's accounting whole
          log.exception("%s: episode failed outside the sandbox", task.name)
          r = EpisodeResult(task.name, task.family, harness.name, self.settings.run_id, episode_id,
                            verification_outcome(infra_error=str(e)), failure_kind=DOCKER_ERROR, error=str(e),
                            endpoint=h)
        # a run that produced no score because its endpoint died: run again on a live endpoint (the
        # endpoint is checked while this run still counts in its load, so it is not chosen meanwhile)
        lost = (r.infra_failure and r.failure_kind not in _NOT_RETRIED
                and len(retried_from) < MAX_ENDPOINT_RETRIES and self._endpoint_died(h))
      finally:
        self._release(h)
      if lost:
        retried_from.append(h)
        with self._lock:
          self.counts["infra_failures.retried"] += 1
        log.warning("%s: episode %s lost with endpoint %s (%s: %s): run again on a live endpoint", task.name,
                    episode_id, _endpoint_name(h), r.failure_kind, " ".join(r.error.split())[:200])
        continue
      break
    r.retried_from = tuple(retried_from)
    with self._lock:
      self.counts["episodes"] += 1
      if r.failure_kind == ABORTED:
        self.counts["aborted"] += 1
      elif r.infra_failure:
        self.counts["infra_failures"] += 1
        self.counts[f"infra:{r.failure_kind or 'unknown'}"] += 1
    return r

  def submit(self, task: Task, harness: Harness | Callable[[], Harness], episode_id: str = "",
             abort: threading.Event | None = None) -> cf.Future:
    """Start one episode; the future's result is its :class:`EpisodeResult`. ``harness`` may be a factory
    (a harness holds per-episode state only in ``run``, so one instance may also be shared). ``abort``: set it
    to stop the episode at once (:func:`run_episode`)."""
    h = harness() if callable(harness) and not isinstance(harness, Harness) else harness
    return self._executor.submit(self._one, task, h, episode_id or uuid.uuid4().hex[:12], abort)

  def run(self, jobs: Iterable[tuple[Task, Harness | Callable[[], Harness]]]) -> list[EpisodeResult]:
    """Run (task, harness) jobs concurrently; results in job order."""
    futs = [self.submit(t, h) for t, h in jobs]
    return [f.result() for f in futs]

  def check_base_images(self, tasks: Iterable[Task]) -> dict:
    """Warn (once, before any build) about every ``FROM`` a build cannot satisfy as written: an image neither
    available on an endpoint nor mapped by ``env.image_map`` (its build will fail), or one whose family image
    is not built (the base image stands in; the warning names the command that builds it). Returns
    {task: [lines]} (:func:`rsi_jax.env.dockerfiles.base_image_problems`)."""
    from rsi_jax.env.dockerfiles import base_image_problems
    from rsi_jax.env.images import _image_exists
    out: dict = {}
    for c in self._live_clients().values():
      for name, lines in base_image_problems(list(tasks), self.settings.image_map,
                                             lambda n: _image_exists(c, n)).items():
        out.setdefault(name, []).extend(x for x in lines if x not in out.get(name, []))
    for name, lines in sorted(out.items()):
      for line in lines:
        log.warning("%s: %s", name, line)
    return out

  def _live_clients(self) -> dict:
    with self._lock:
      return {h: c for h, c in self.clients.items() if c is not None and h not in self._down}

  def prebuild(self, tasks: Iterable[Task]):
    """Build every task's image on every live endpoint (concurrently), so episodes start at once. An endpoint
    that dies meanwhile is taken out of rotation (its episodes build there when it is back)."""
    futs = [(h, self._executor.submit(build_task_image, c, t, self.settings.image_map,
                                      self.settings.build_network, self.settings.build_ca_bundle))
            for t in tasks for h, c in self._live_clients().items()]
    for h, f in futs:
      try:
        f.result()
      except Exception:
        if not self._endpoint_died(h):
          raise

  def close(self):
    with self._cv:
      self._closed = True
      self._cv.notify_all()
    self._executor.shutdown(wait=True, cancel_futures=True)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
