"""The container runtime: one locked-down container per episode with a persistent shell (SPEC §6–7).

A container runs with ``--network none``, every capability dropped, ``no-new-privileges``, CPU / memory / pids
limits from the task, and labels (``rsi_jax.run``, ``rsi_jax.task``, ``rsi_jax.episode`` plus the owning host
and pid, which let :func:`rsi_jax.env.reaper.reap_orphans` remove what a crashed run left behind).
Images are built by :mod:`rsi_jax.env.images`; process-wide teardown is :mod:`rsi_jax.env.reaper`.

The persistent shell: every command runs in a fresh ``bash`` that first restores the episode's shell state
(working directory and exported variables, saved by the previous command's exit trap), so ``cd`` and
``export`` survive between commands while a hung or killed command can never wedge the shell: recovery is
the next command. Every ``docker exec`` process is a session and process-group leader, so a watchdog (in
a session of its own) kills the command's whole process group at the timeout, background jobs it started
included. Output goes to a file in the container, not to the exec stream, so a
background job that keeps its stdout open cannot hold a command open; it comes back capped
(``output_cap_bytes``, the middle elided). The scripts themselves are in :mod:`rsi_jax.env.sandbox_shell`.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import socket
import tarfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

import docker
import docker.errors

from rsi_jax.env.overlay import local_layers, overlay_changes, tree_bytes
from rsi_jax.env.reaper import _LIVE, _LIVE_LOCK, LABEL_EPISODE, LABEL_HOST, LABEL_PID, LABEL_RUN, LABEL_TASK
from rsi_jax.env.sandbox_shell import COLLECT_SCRIPT, INIT_CMD, RAW_SCRIPT, SHELL_SCRIPT, split_trailer

log = logging.getLogger(__name__)

# PATH for the verifier and helper execs: fixed, never the agent's.
SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"  # system tools first

# Failure kinds (EpisodeResult.failure_kind / SandboxError.kind).
CONTAINER_DIED = "container_died"
DOCKER_ERROR = "docker_error"
BACKSTOP_GRACE_S = 5.0  # host-side kill of a command this long after its timeout (the watchdog was killed)
CREATE_FAILED = "create_failed"
BUILD_FAILED = "build_failed"
VERIFIER_TIMEOUT = "verifier_timeout"
VERIFIER_ERROR = "verifier_error"
DISK_LIMIT = "disk_limit"  # the container wrote more than its storage limit: stopped
DISK_POLL_S = 1.0  # during a command the writable layer is measured this often (its changed files only)


class SandboxError(RuntimeError):
  """An infrastructure failure (not the agent's doing). ``kind`` is one of the failure kinds above."""

  def __init__(self, kind: str, message: str):
    super().__init__(f"{kind}: {message}")
    self.kind = kind


@dataclasses.dataclass(frozen=True)
class CommandResult:
  output: str  # stdout and stderr interleaved, capped (middle elided)
  exit_code: int  # 124 on timeout
  timed_out: bool
  duration_s: float


# ------------------------------------------------------------------------------------------------ clients

_CLIENTS: dict = {}
_CLIENTS_LOCK = threading.Lock()


def docker_client(host: str | None = None, timeout_s: float = 3600.0, pool_size: int = 64):
  """A shared client for one endpoint: None / "" = the local daemon (DOCKER_HOST or the default socket),
  else a ``unix://``, ``tcp://`` or ``ssh://`` URL. Raises SandboxError(docker_error) if it does not answer.
  ``timeout_s`` bounds one API call; commands are bounded by their own (shorter) in-container watchdogs."""
  key = (host or "", timeout_s, pool_size)
  with _CLIENTS_LOCK:
    c = _CLIENTS.get(key)
    if c is None:
      try:
        if host:
          c = docker.DockerClient(base_url=host, timeout=int(timeout_s), max_pool_size=pool_size)
        else:
          c = docker.from_env(timeout=int(timeout_s), max_pool_size=pool_size)
        c.ping()
      except docker.errors.DockerException as e:
        raise SandboxError(DOCKER_ERROR, f"no Docker daemon answers at {host or 'the local socket'}: {e}")
      _CLIENTS[key] = c
  return c


# ----------------------------------------------------------------------------------------------- sandbox


# Docker's default capability set minus what a task sandbox has no use for (raw sockets, device nodes, the
# audit log, file capabilities); ordinary root work (chown, useradd, tar -x keeping owners, apt/dpkg, setuid
# to an unprivileged user) keeps working. With no-new-privileges and Docker's default seccomp profile.
CAP_DROP = ("NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP")
SECURITY_OPT = ("no-new-privileges",)


class DockerSandbox:
  """One episode's container. Use as a context manager; :meth:`close` is idempotent and always safe."""

  def __init__(self, client, image: str, *, run_id: str, task_name: str = "", episode_id: str = "",
               cpus: float = 1.0, memory_bytes: int = 2 << 30, pids_limit: int = 512,
               network: str = "none", output_cap_bytes: int = 10_000, command_timeout_s: float = 60.0,
               disk_limit_bytes: int | None = None):
    self.client = client
    self.image = image
    self.run_id, self.task_name = run_id, task_name
    self.episode_id = episode_id or uuid.uuid4().hex[:12]
    self.cpus, self.memory_bytes, self.pids_limit = cpus, memory_bytes, pids_limit
    self.network = network
    self.output_cap_bytes = output_cap_bytes
    self.command_timeout_s = command_timeout_s
    self.disk_limit_bytes = disk_limit_bytes  # checked during and after every command (None: unlimited)
    self.container = None
    self._upper = None  # the writable layer's folder, where this host can read it (a local daemon's overlay2)
    self._layers = None  # (upper, lowers) read here for changes(); False: the daemon answers
    self.start_latency_s = None
    self._n = 0
    self._raw_read: list[str] = []  # trusted commands' kept outputs the host has read (removed by the next one)
    self._closed = False

  # -- lifecycle

  def start(self) -> "DockerSandbox":
    t0 = time.time()
    labels = {LABEL_RUN: self.run_id, LABEL_TASK: self.task_name, LABEL_EPISODE: self.episode_id,
              LABEL_HOST: socket.gethostname(), LABEL_PID: str(os.getpid())}
    try:
      self.container = self.client.containers.run(
          self.image, INIT_CMD, detach=True, labels=labels, network_mode=self.network,
          cap_drop=list(CAP_DROP), security_opt=list(SECURITY_OPT), nano_cpus=int(self.cpus * 1e9),
          mem_limit=self.memory_bytes, memswap_limit=self.memory_bytes, pids_limit=self.pids_limit,
          hostname="sandbox", stdin_open=False, tty=False)
    except docker.errors.DockerException as e:
      # A create that failed half way may still have left a container behind.
      for c in self.client.containers.list(all=True, filters={"label": f"{LABEL_EPISODE}={self.episode_id}"},
                                                ignore_removed=True):
        c.remove(force=True)
      raise SandboxError(CREATE_FAILED, f"{self.task_name}: {e}") from None
    with _LIVE_LOCK:
      _LIVE[self.container.id] = self
    if self.disk_limit_bytes:
      self._layers = local_layers(self.client, self.container) or False
      self._upper = self._layers[0] if self._layers else None
    self.start_latency_s = time.time() - t0
    return self

  def close(self):
    if self._closed or self.container is None:
      self._closed = True
      return
    self._closed = True
    with _LIVE_LOCK:
      _LIVE.pop(self.container.id, None)
    try:
      self.container.remove(force=True)
    except docker.errors.NotFound:
      pass
    except docker.errors.DockerException as e:
      log.warning("could not remove container %s: %s", self.container.short_id, e)

  def __enter__(self):
    return self.start() if self.container is None else self

  def __exit__(self, *exc):
    self.close()

  def is_running(self) -> bool:
    try:
      self.container.reload()
      return self.container.status == "running"
    except docker.errors.DockerException:
      return False

  def _check_alive(self, what: str):
    if not self.is_running():
      raise SandboxError(CONTAINER_DIED, f"container of {self.task_name} is gone during {what}")

  def _check_alive_after_a_kill(self, what: str, wait_s: float = 2.0):
    """After a process died unexplained: a container being killed loses its processes before its status
    changes, so it is looked at again for ``wait_s`` before the death is put down to anything else."""
    deadline = time.time() + wait_s
    while True:
      self._check_alive(what)
      if time.time() >= deadline:
        return
      time.sleep(0.25)

  # -- commands

  def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
    """Run one agent command in the persistent shell (cwd and exported variables carry over). The container's
    writes are held against its storage limit while the command runs (where the writable layer can be read
    from this host, every ``DISK_POLL_S``: a command that writes far past the limit is stopped then, not when
    it ends) and after it (:meth:`check_disk`)."""
    over = threading.Event()
    done = threading.Event()
    watch = None
    if self.disk_limit_bytes and self._upper is not None:
      watch = threading.Thread(target=self._watch_disk, args=(done, over), daemon=True)
      watch.start()
    try:
      res = self._run(command, timeout_s)
    finally:
      done.set()
      if watch is not None:
        watch.join()
    self.check_disk()
    return res

  def _watch_disk(self, done: threading.Event, over: threading.Event):
    """While a command runs: over the limit, every process in the container is stopped (the command returns
    and :meth:`check_disk` reports it)."""
    while not done.wait(DISK_POLL_S):
      try:
        if self.disk_used() > self.disk_limit_bytes:
          over.set()
          self.exec_raw(["kill", "-KILL", "-1"], timeout_s=30)
          return
      except Exception:  # noqa: BLE001 - the check after the command reports what is wrong
        return

  def disk_used(self) -> int:
    """Bytes the container has written: its writable layer's files, summed here where this host can read the
    layer (a local daemon; the changed files only, about 10 ms), else by the daemon (``docker ps --size``, which
    also walks the whole image)."""
    if self._upper is not None:
      try:
        return tree_bytes(self._upper)
      except OSError:
        self._upper = None  # unreadable after all: the daemon measures from now on
    try:
      rows = self.client.api.containers(all=True, size=True, filters={"id": self.container.id})
    except docker.errors.DockerException as e:
      self._check_alive("a size check")
      raise SandboxError(DOCKER_ERROR, f"size check failed: {e}") from None
    return int((rows[0].get("SizeRw") if rows else 0) or 0)

  def check_disk(self):
    """Over ``disk_limit_bytes``: every process in the container is stopped and :class:`SandboxError`
    (``disk_limit``) ends the episode, which is counted and masked, with the reason."""
    if not self.disk_limit_bytes:
      return
    used = self.disk_used()
    if used > self.disk_limit_bytes:
      self.exec_raw(["kill", "-KILL", "-1"], timeout_s=30)
      raise SandboxError(DISK_LIMIT, f"{self.task_name}: the container wrote {used / 2**20:.0f} MiB, over its "
                                     f"storage limit of {self.disk_limit_bytes / 2**20:.0f} MiB (task "
                                     f"environment.storage or env.disk_limit); stopped")

  def _run(self, command: str, timeout_s: float | None = None) -> CommandResult:
    timeout_s = float(timeout_s or self.command_timeout_s)
    self._n += 1
    n = self._n
    t0 = time.time()
    # The in-container watchdog runs as root beside the agent, which can kill it (`pkill sleep`); a host-side
    # timer then ends the command the same way, so a command never outlives its timeout by more than a grace.
    backstop = threading.Timer(timeout_s + BACKSTOP_GRACE_S, self._kill_command, args=(n,))
    backstop.daemon = True
    backstop.start()
    try:
      res = self.container.exec_run(
          ["/bin/bash", "-c", SHELL_SCRIPT, "bash", str(n), f"{timeout_s:g}",
           str(self.output_cap_bytes)], environment={"RSI_CMD": command}, demux=False)
    except docker.errors.DockerException as e:  # (an exec into a container being killed fails so)
      self._check_alive_after_a_kill("a command")
      raise SandboxError(DOCKER_ERROR, f"exec failed: {e}") from None
    finally:
      backstop.cancel()
    dt = time.time() - t0
    out = res.output or b""
    done = split_trailer(out)
    if done is None:
      # The shell was killed: by its watchdog (timeout), by the agent itself, or with the container.
      self._check_alive("a command")
      col = self.exec_raw(["/bin/bash", "-c", COLLECT_SCRIPT, "bash", str(n), str(self.output_cap_bytes)],
                          timeout_s=30)
      status, _, out = col.output.partition("\n")
      done = split_trailer(out.encode()) if status == "DONE" else None
      if done is not None:  # it finished; Docker lost its output stream
        log.warning("%s: command %d's output stream was lost; its result was read from the container",
                    self.task_name, n)
        return CommandResult(done[0].decode("utf-8", "replace"), done[1], False, dt)
      if status == "TIMEOUT":
        msg = f"\n[command timed out after {timeout_s:g}s and was killed]"
        return CommandResult(out + msg, 124, True, dt)
      # Killed, not by its watchdog: by the agent itself, or with its container.
      self._check_alive_after_a_kill("a command")
      return CommandResult(out, 137, False, dt)
    return CommandResult(done[0].decode("utf-8", "replace"), done[1], False, dt)

  def _kill_command(self, n: int):
    """Host-side backstop for command ``n``: mark it timed out and kill its process group."""
    try:
      self.exec_raw(["/bin/bash", "-c", f": > /tmp/.rsi_shell/timeout.{n}; "
                     f"kill -KILL -- -$(cat /tmp/.rsi_shell/pid.{n})"], timeout_s=10)
    except Exception:  # noqa: BLE001 - the container may be gone; run() reports that itself
      log.debug("backstop kill of command %d failed", n, exc_info=True)

  def exec_raw(self, argv: list[str], *, timeout_s: float, env: Mapping[str, str] | None = None,
               workdir: str = "/", cap_bytes: int | None = None) -> CommandResult:
    """Run a trusted command (not through the agent's shell state) with a fixed environment; its whole
    process group is killed at the timeout. A command that ended on its own without its output arriving is
    :class:`SandboxError` (``docker_error``: infrastructure), never an empty output."""
    kept = f"/tmp/.rsi_raw.{uuid.uuid4().hex}"
    read, self._raw_read = self._raw_read, []
    environment = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": "/root", "RSI_TIMEOUT": f"{timeout_s:g}"}
    environment.update(env or {})
    environment.update(RSI_RAW_OUT=kept, RSI_RAW_DONE=" ".join(read))
    t0 = time.time()
    try:
      res = self.container.exec_run(["/bin/bash", "-c", RAW_SCRIPT, "bash", *argv],
                                    environment=environment, workdir=workdir, demux=False)
    except docker.errors.DockerException as e:  # (an exec into a container being killed fails so)
      self._check_alive_after_a_kill(argv[0])
      raise SandboxError(DOCKER_ERROR, f"exec failed: {e}") from None
    dt = time.time() - t0
    out = (res.output or b"")
    code = 137 if res.exit_code is None else int(res.exit_code)
    done = split_trailer(out)
    if done is None and self.is_running():
      # its output stream was lost (moby/moby#27289: a short command on a loaded machine), or it was killed:
      # what it wrote is in the container (a plain copy, not an exec's stream)
      back = self.get_file(kept)
      if back is not None:
        done = split_trailer(back)
        if done is not None:
          log.info("%s: %s's output stream was lost; its result was read from the container", self.task_name,
                   argv[0])
        elif code == 137:
          out = back  # what a killed command had written
    self._raw_read.append(kept)
    if done is not None:
      out = done[0]
    elif code != 137:  # it ended on its own, yet its output did not arrive and was not kept, or its
      self._check_alive_after_a_kill(argv[0])  # container is being killed
      raise SandboxError(DOCKER_ERROR, f"{argv[0]} exited {code} without its end mark: its shell was killed "
                                       f"or Docker lost its output stream")
    if cap_bytes is not None and len(out) > cap_bytes:
      out = out[:cap_bytes // 2] + b"\n[... output elided ...]\n" + out[-(cap_bytes - cap_bytes // 2):]
    killed = code == 137
    timed_out = killed and dt >= timeout_s - 0.5
    if killed and not timed_out:
      self._check_alive_after_a_kill(argv[0])
    return CommandResult(out.decode("utf-8", "replace"), code, timed_out, dt)

  # -- files

  def put_files(self, files: Mapping[str, bytes | str | Path], mode: int = 0o644):
    """Write files into the container: {absolute container path: content bytes/str or a host Path}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
      _add_files(tar, files, mode)
    self._put_archive(buf.getvalue())

  def put_dir(self, host_dir: str | Path, container_dir: str, extra: Iterable[Path] = (),
              files: Mapping[str, bytes | str | Path] | None = None):
    """Copy a host folder's content (and extra files) into ``container_dir`` (created, modes kept), and
    ``files`` as :meth:`put_files` writes them, in one copy."""
    host_dir = Path(host_dir)
    buf = io.BytesIO()
    base = container_dir.strip("/")
    with tarfile.open(fileobj=buf, mode="w") as tar:
      tar.add(host_dir, arcname=base, recursive=True, filter=_root_owned)
      for f in extra:
        tar.add(f, arcname=f"{base}/{Path(f).name}", filter=_root_owned)
      _add_files(tar, files or {}, 0o644)
    self._put_archive(buf.getvalue())

  def _put_archive(self, data: bytes):
    try:
      ok = self.container.put_archive("/", data)
    except docker.errors.DockerException as e:
      self._check_alive("a copy")
      raise SandboxError(DOCKER_ERROR, f"copy into container failed: {e}") from None
    if not ok:
      raise SandboxError(DOCKER_ERROR, "copy into container failed")

  def get_file(self, path: str, max_bytes: int = 16 << 20) -> bytes | None:
    """A regular file's content from the container (None if it does not exist or is not a file)."""
    try:
      stream, _ = self.container.get_archive(path)
    except docker.errors.NotFound:
      return None
    except docker.errors.DockerException as e:
      self._check_alive("a copy")
      raise SandboxError(DOCKER_ERROR, f"copy out of container failed: {e}") from None
    raw = b"".join(stream)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
      m = tar.next()
      if m is None or not m.isfile():
        return None
      return tar.extractfile(m).read(max_bytes)

  def changes(self) -> list[dict]:
    """Changes relative to the image (``docker diff``): [{"Path": ..., "Kind": 0 modified | 1 added |
    2 deleted}]. Read from the container's layers where this host can (:mod:`rsi_jax.env.overlay`, the
    daemon's answer in a few ms instead of about half a second), else asked of the daemon."""
    if self._layers is None:
      self._layers = local_layers(self.client, self.container) or False
    if self._layers:
      try:
        return overlay_changes(*self._layers)
      except OSError as e:
        log.warning("%s: the writable layer cannot be read here (%s): the daemon lists the changes",
                    self.task_name, e)
        self._layers = False
    try:
      return list(self.container.diff() or [])
    except docker.errors.DockerException as e:
      self._check_alive("a diff")
      raise SandboxError(DOCKER_ERROR, f"diff failed: {e}") from None


def _add_files(tar: tarfile.TarFile, files: Mapping[str, bytes | str | Path], mode: int):
  for dst, src in files.items():
    if isinstance(src, Path):
      data, m = src.read_bytes(), src.stat().st_mode & 0o777
    else:
      data, m = (src.encode() if isinstance(src, str) else src), mode
    info = tarfile.TarInfo(dst.lstrip("/"))
    info.size, info.mode, info.mtime = len(data), m, int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _root_owned(ti: tarfile.TarInfo) -> tarfile.TarInfo:
  ti.uid = ti.gid = 0
  ti.uname = ti.gname = "root"
  return ti
