"""The environment pool: episodes run concurrently over Docker endpoints, with endpoint health, retries, prebuilds.

:class:`EnvPool` runs many episodes (:func:`rsi_jax.env.episode.run_episode`) concurrently (a thread per
running episode, at most ``concurrency``) across one or more Docker endpoints, each episode on the least-loaded
live endpoint, and counts their infrastructure failures.

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
import concurrent.futures as cf
import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence

from rsi_jax.env.episode import (ABORTED, NEEDS_BUILD_NETWORK, NEEDS_INTERNET, EnvSettings, EpisodeResult,
                                 run_episode)
from rsi_jax.env.harness import Harness
from rsi_jax.env.images import build_task_image
from rsi_jax.env.reaper import LABEL_HOST, LABEL_PID, LABEL_RUN, install_signal_handlers, reap_orphans
from rsi_jax.env.sandbox import DOCKER_ERROR, SandboxError, docker_client
from rsi_jax.env.tasks import Task
from rsi_jax.env.verifier import NEEDS_NETWORK
from rsi_jax.rl.ctrf import verification_outcome

log = logging.getLogger(__name__)


# not retried on another endpoint: refusals and stops that say nothing about the endpoint
_NOT_RETRIED = (NEEDS_INTERNET, NEEDS_BUILD_NETWORK, NEEDS_NETWORK, ABORTED)
MAX_ENDPOINT_RETRIES = 3  # runs of one episode ended by a dead endpoint before its failure is kept
PROBE_TIMEOUT_S = 5.0  # a ping that takes longer counts as no answer


class AllEndpointsDown(RuntimeError):
  """Every Docker endpoint of the pool stayed down for ``env.endpoint_wait_s`` (raised from the episode's
  future: :meth:`EnvPool.run` raises it), or none answered when the pool was made. One line naming each
  endpoint and why it is down."""


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


class NoEnvPool:
  """The environment of a run that runs no episode (every phase trains on generated data, nothing is evaluated:
  ``rsr.policy: corpus`` with no ``eval.tasks_dir``): no Docker endpoint is contacted, nothing is counted, and
  anything that would run an episode is an error naming why there is none."""
  clients: dict = {}

  def __init__(self):
    self.counts = collections.Counter()

  def close(self):
    pass

  def check_base_images(self, tasks) -> dict:
    return {}

  def __getattr__(self, name):
    raise RuntimeError(f"this run has no environment (EnvPool.{name}): every phase of its plan trains on "
                       f"generated data and nothing is evaluated, so no Docker endpoint was contacted")


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
