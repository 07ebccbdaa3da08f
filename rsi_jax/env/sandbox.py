"""Docker terminal sandboxes: one locked-down container per episode with a persistent shell (SPEC §6–7).

A container runs with ``--network none``, every capability dropped, ``no-new-privileges``, CPU / memory / pids
limits from the task, and labels (``rsi_jax.run``, ``rsi_jax.task``, ``rsi_jax.episode`` plus the owning host
and pid, which let :func:`reap_orphans` remove what a crashed run left behind).

The persistent shell: every command runs in a fresh ``bash`` that first restores the episode's shell state
(working directory and exported variables, saved by the previous command's exit trap), so ``cd`` and
``export`` survive between commands while a hung or killed command can never wedge the shell: recovery is
the next command. Every ``docker exec`` process is a session and process-group leader, so a watchdog (in
a session of its own) kills the command's whole process group at the timeout, background jobs it started
included. Output goes to a file in the container, not to the exec stream, so a
background job that keeps its stdout open cannot hold a command open; it comes back capped
(``output_cap_bytes``, the middle elided).
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import io
import logging
import os
import re
import shutil
import signal
import socket
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

import docker
import docker.errors

from rsi_jax.env.tasks import Task, rewrite_dockerfile

log = logging.getLogger(__name__)

LABEL_RUN = "rsi_jax.run"
LABEL_TASK = "rsi_jax.task"
LABEL_EPISODE = "rsi_jax.episode"
LABEL_HOST = "rsi_jax.host"
LABEL_PID = "rsi_jax.pid"
TASK_IMAGE_PREFIX = "rsi-task-"
SHELL_DIR = "/tmp/.rsi_shell"
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

# PID 1: a bash that reaps orphans. It installs no signal handler, so as a namespace's init it ignores every
# signal sent from inside (an agent cannot end its own container) and survives `kill -KILL -1`; teardown
# kills it from outside.
INIT_CMD = ["/bin/bash", "-c", "while :; do /usr/bin/sleep 86400 & wait $!; done"]

# One agent command. argv: $1 command id, $2 timeout (s), $3 output cap (bytes); env RSI_CMD: the command.
_SHELL_SCRIPT = r"""
__rsi_d=/tmp/.rsi_shell; __rsi_id=$1; __rsi_o=$__rsi_d/out.$1
/usr/bin/mkdir -p "$__rsi_d"
echo $$ > "$__rsi_d/pid.$1"
/usr/bin/setsid /bin/bash -c '/usr/bin/sleep "$1"; : > "$2"; kill -KILL -- -"$3"' _ "$2" \
  "$__rsi_d/timeout.$1" $$ </dev/null >/dev/null 2>&1 &
__rsi_wd=$!
__rsi_cap=$3
exec 3>&1 1>/dev/null 2>/dev/null
[ -f "$__rsi_d/state" ] && . "$__rsi_d/state"
__rsi_exit() {
  __rsi_rc=$?
  set +e +u +o pipefail  # the command's own shell options (set -euo pipefail) end with it
  { export -p; printf 'cd -- %q\n' "$PWD"; } > "$__rsi_d/state.tmp" && /usr/bin/mv -f "$__rsi_d/state.tmp" "$__rsi_d/state"
  kill -KILL -- -"$__rsi_wd" 2>/dev/null || kill -KILL "$__rsi_wd" 2>/dev/null  # (not yet its own group)
  __rsi_n=$(/usr/bin/stat -c %s "$__rsi_o" || echo 0)
  if [ "$__rsi_n" -le "$__rsi_cap" ]; then /usr/bin/cat "$__rsi_o" >&3
  else
    /usr/bin/head -c $((__rsi_cap / 2)) "$__rsi_o" >&3
    printf '\n[... %d bytes of output elided ...]\n' $((__rsi_n - __rsi_cap)) >&3
    /usr/bin/tail -c $((__rsi_cap - __rsi_cap / 2)) "$__rsi_o" >&3
  fi
  /usr/bin/rm -f "$__rsi_o"
  printf '\036RSI:%d\036' "$__rsi_rc" >&3
  exit $__rsi_rc
}
trap __rsi_exit EXIT
__rsi_c=$RSI_CMD; unset RSI_CMD
eval "$__rsi_c" >"$__rsi_o" 2>&1 </dev/null 3>&-
"""

_END = b"\x1eRSI:"  # the exit trap's trailer: output, then \x1eRSI:<exit code>\x1e

# After a timeout kill: what the command had printed, capped the same way. argv: $1 id, $2 cap.
_COLLECT_SCRIPT = r"""
o=/tmp/.rsi_shell/out.$1; cap=$2
[ -f /tmp/.rsi_shell/timeout.$1 ] && echo TIMEOUT || echo KILLED
n=$(stat -c %s "$o" 2>/dev/null || echo 0)
if [ "$n" -le "$cap" ]; then cat "$o" 2>/dev/null
else head -c $((cap / 2)) "$o"; printf '\n[... %d bytes of output elided ...]\n' $((n - cap)); tail -c $((cap - cap / 2)) "$o"; fi
rm -f "$o" /tmp/.rsi_shell/timeout.$1
"""

# A trusted command with a fixed environment and a hard timeout on its whole process group. argv: cmd...
_RAW_SCRIPT = r"""
/usr/bin/setsid /bin/bash -c '/usr/bin/sleep "$1"; kill -KILL -- -"$2"' _ "$RSI_TIMEOUT" $$ \
  </dev/null >/dev/null 2>&1 &
w=$!
disown "$w"
"$@"
rc=$?
kill -KILL -- -"$w" 2>/dev/null
exit $rc
"""


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


# ------------------------------------------------------------------------------------------------ images

_BUILD_LOCKS: dict[str, threading.Lock] = {}
_BUILD_LOCKS_LOCK = threading.Lock()


def _image_exists(client, name: str) -> bool:
  try:
    client.images.get(name)
    return True
  except docker.errors.ImageNotFound:
    return False
  except docker.errors.APIError:
    return False


def _context_files(task: Task) -> list[Path]:
  """The build context's files and links, in a fixed order; a link (to a file or a folder) is listed, never
  followed. Anything else (a FIFO, a socket, a device) raises SandboxError(build_failed)."""
  root = task.context_dir
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    rel = Path(dirpath).relative_to(root)
    if rel == Path("."):
      dirnames[:] = [d for d in dirnames if d not in task.context_exclude]
      filenames = [f for f in filenames if f not in task.context_exclude]
    links = [d for d in dirnames if (Path(dirpath) / d).is_symlink()]
    dirnames[:] = sorted(d for d in dirnames if d not in links)
    for name in sorted(filenames + links):
      f = Path(dirpath) / name
      if not f.is_symlink() and not f.is_file():
        raise SandboxError(BUILD_FAILED, f"{task.name}: {f} in the build context is not a regular file, folder "
                                         f"or link: refused")
      out.append(f)
  return out


def _check_links(task: Task, copy: Path):
  """Every link of the build context copied to ``copy`` must stay inside it: relative, and resolving (through
  other links too) to a path within it. SandboxError(build_failed) names the task's link and its target."""
  real = Path(os.path.realpath(copy))
  for dirpath, dirnames, filenames in os.walk(copy):
    for name in dirnames + filenames:
      f = Path(dirpath) / name
      if not f.is_symlink():
        continue
      target = os.readlink(f)
      if os.path.isabs(target) or not Path(os.path.realpath(f)).is_relative_to(real):
        own = Path(task.context_dir) / f.relative_to(copy)
        raise SandboxError(BUILD_FAILED, f"{task.name}: {own} is a link to {target}, which leaves the build "
                                         f"context {task.context_dir}: refused (a link in the context must "
                                         f"point inside it by a relative path)")


def task_image_tag(client, task: Task, image_map: Mapping[str, str], ca_bundle: str | None = None,
                   verifier_deps: bool = False) -> tuple[str, str, list]:
  """(tag, rewritten Dockerfile, FROM rewrites). The tag hashes the build context (a link by its target, not
  what it points to), the rewritten Dockerfile (with the build CA bundle's digest, when one is used) and the
  ids of the base images it names, so a changed task or a rebuilt base image gives a new tag."""
  text, changes = rewrite_dockerfile(task.dockerfile.read_text(), image_map,
                                     lambda n: _image_exists(client, n), where=str(task.dockerfile))
  if verifier_deps:  # what the verifier fetches at test time, fetched now (rsi_jax.env.verifier_deps)
    from rsi_jax.env.verifier_deps import build_steps
    steps = build_steps(task, text)
    if steps:
      text = text.rstrip("\n") + "\n" + steps
  if ca_bundle:
    text = with_build_ca(text, hashlib.sha256(Path(ca_bundle).read_bytes()).hexdigest())
  h = hashlib.sha256(text.encode())
  for line in text.splitlines():
    parts = line.split()
    if parts and parts[0].upper() == "FROM":
      base = next((p for p in parts[1:] if not p.startswith("--")), "")
      try:
        h.update(client.images.get(base).id.encode())
      except docker.errors.DockerException:
        h.update(base.encode())
  for f in _context_files(task):
    if f == task.dockerfile:
      continue
    if f.is_symlink():  # the link itself, never what it points to
      h.update(str(f.relative_to(task.context_dir)).encode() + b"\0link\0" + os.readlink(f).encode() + b"\0")
      continue
    h.update(str(f.relative_to(task.context_dir)).encode() + b"\0" + oct(f.stat().st_mode & 0o777).encode())
    h.update(hashlib.sha256(f.read_bytes()).digest())
  return f"{TASK_IMAGE_PREFIX}{task.name.lower()}:{h.hexdigest()[:16]}", text, changes


# A CA bundle for builds that reach package registries (behind a TLS-inspecting proxy the host's own bundle is
# needed): copied into every build stage and named by the variables pip, requests, uv, curl, git and node
# read, as build arguments (set for RUN steps, not kept in the image's environment).
CA_IN_CONTEXT = ".rsi-build-ca.pem"
CA_IN_IMAGE = "/etc/ssl/certs/rsi-build-ca.pem"
CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
                "NODE_EXTRA_CA_CERTS", "UV_NATIVE_TLS")
CA_LINES_PER_FROM = 1 + len(CA_VARIABLES)  # with_build_ca: the COPY and one ARG per variable


SYSTEM_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                     "/etc/ssl/cert.pem")


def host_ca_bundle() -> str | None:
  """The host's CA bundle: the file its environment names (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, PIP_CERT,
  CURL_CA_BUNDLE), else the system trust store's bundle, if one exists."""
  for k in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE"):
    v = os.environ.get(k)
    if v and Path(v).is_file():
      return v
  return next((p for p in SYSTEM_CA_BUNDLES if Path(p).is_file()), None)


def with_build_ca(dockerfile: str, ca_digest: str) -> str:
  """``dockerfile`` with the build CA bundle installed at the start of every stage: a header line, and
  :data:`CA_LINES_PER_FROM` lines after each FROM (:func:`_own_lines` maps a build's lines back)."""
  from rsi_jax.env.tasks import _FROM
  out = [f"# rsi_jax: build CA bundle sha256:{ca_digest}"]
  for line in dockerfile.splitlines():
    out.append(line)
    if _FROM.match(line):
      out.append(f"COPY {CA_IN_CONTEXT} {CA_IN_IMAGE}")
      out += [f"ARG {k}={'1' if k == 'UV_NATIVE_TLS' else CA_IN_IMAGE}" for k in CA_VARIABLES]
  return "\n".join(out) + "\n"


_FAILED_BUILDS: dict[str, str] = {}  # "<endpoint> <tag>" -> why its build failed (a build error, not a daemon fault)
# A failed build's reason: at most this long, each log line at most _LINE_MAX characters.
REASON_MAX_CHARS = 2000
_LINE_MAX = 240
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CAUSE = re.compile(r"(?i:\b(?:error|errors|failed|failure|fatal|could not|couldn't|cannot|can't|unable to|"
                    r"not found|no such|denied|refused|unreachable|timed out|invalid|no matching)\b)|^E: ")
# A host an earlier step could not reach: that step may still have "succeeded" (``curl ... | sh`` without
# pipefail) and left the failing step without the tool it fetched.
_UNREACHED = re.compile(r"(?i:could not resolve host|temporary failure in name resolution|name or service not known|"
                        r"network is unreachable|unable to find the server|failed to establish a new connection|"
                        r"getaddrinfo|no route to host)")
ADDED_CA, ADDED_DEPS = "ca", "deps"  # _own_lines: a line of the build CA's, of the verifier's fetch steps


def _clip(line: str, n: int = _LINE_MAX) -> str:
  return line if len(line) <= n else line[:n // 3] + " [...] " + line[-(n - n // 3 - 7):]


def _log_lines(text: str) -> list[str]:
  """Build output as a terminal shows it: escape codes removed, a line redrawn with carriage returns (a
  progress meter) reduced to what it showed last, blank lines left out, long lines clipped in the middle."""
  out = []
  for line in _ANSI.sub("", text).split("\n"):
    parts = [x for x in line.split("\r") if x.strip()]
    if parts:  # a message printed right after a progress meter's last state: the message
      out.append(_clip(re.sub(r"^[\d\s.:%kKMGB/-]{20,}(?=[A-Za-z])", "", parts[-1]).rstrip()))
  return out


def _instruction_lines(text: str) -> list[int]:
  """The line (1-based) each instruction of a Dockerfile starts on, in order: the build's steps."""
  out, cont = [], False
  for i, line in enumerate(text.split("\n"), 1):
    stripped = line.strip()
    if cont and (not stripped or stripped.startswith("#")):  # blank and comment lines inside an instruction
      continue
    if not cont:
      if not stripped or stripped.startswith("#"):
        continue
      out.append(i)
    cont = stripped.endswith("\\")
  return out


def _own_lines(text: str, own_count: int, ca: bool) -> list:
  """For each line of the Dockerfile a build reads (``text``), the line of the task's own Dockerfile it is,
  or :data:`ADDED_CA` (the build CA's lines, :func:`with_build_ca`) / :data:`ADDED_DEPS` (the verifier's fetch
  steps after the task's own lines, :mod:`rsi_jax.env.verifier_deps`)."""
  from rsi_jax.env.tasks import _FROM
  out, own, skip = [], 0, 0
  for i, line in enumerate(text.split("\n")):
    if (ca and i == 0) or skip:
      out.append(ADDED_CA)
      skip = max(skip - 1, 0)
      continue
    own += 1
    out.append(own if own <= own_count else ADDED_DEPS)
    if ca and _FROM.match(line):
      skip = CA_LINES_PER_FROM
  return out


def _where(task: Task, origin: list, line: int) -> str | None:
  """Line ``line`` of the Dockerfile a build read, in the task's terms."""
  if not 0 < line <= len(origin):
    return None
  own = origin[line - 1]
  if own == ADDED_CA:
    return f"the build CA step added after a FROM of {task.dockerfile}"
  if own == ADDED_DEPS:
    return f"a step added after {task.dockerfile} for what the verifier script fetches at test time"
  return f"{task.dockerfile} line {own}"


def _build_failure(task: Task, logs: list, error: str, text: str, origin: list) -> str:
  """Why a build failed, in one line (the task, the failing step with its own Dockerfile line, the cause)
  followed by the lines of the step's output that say why (error lines and its last lines), within
  :data:`REASON_MAX_CHARS`."""
  lines = _log_lines("".join(str(x.get("stream", "")) for x in logs if isinstance(x, dict)))
  steps = [i for i, x in enumerate(lines) if re.match(r"Step \d+/\d+ : ", x)]
  where, step, body = "its first step", "", lines
  if steps:
    step = lines[steps[-1]]
    body = lines[steps[-1] + 1:]
    m = re.match(r"Step (\d+)/\d+ : (\S+)", step)
    starts, rows = _instruction_lines(text), text.split("\n")
    n = int(m.group(1))
    if n <= len(starts) and rows[starts[n - 1] - 1].strip().upper().startswith(m.group(2).upper()):
      where = _where(task, origin, starts[n - 1]) or where
      added = origin[starts[n - 1] - 1] in (ADDED_CA, ADDED_DEPS)
    else:
      added = False
    step = "" if added else " (" + _clip(step.split(" : ", 1)[1], 160) + ")"  # an added step: named by its output
  body = [x for x in body if not x.startswith((" ---> ", "Removing intermediate container"))]
  causes = [i for i, x in enumerate(body) if _CAUSE.search(x)]
  last = [i for i, x in enumerate(body) if re.search(r"[A-Za-z]{3}", x)]
  err = " ".join(_ANSI.sub("", error or "").split())
  err = re.sub(r"^The command .* returned a non-zero code: (\d+)$", r"the step exited with status \1", err)
  head = _clip(f"{task.name}: image build failed at {where}{step}: "
               f"{body[causes[-1]].strip() if causes else err}", 600)
  keep = sorted(set(causes[-5:]) | set(last[-5:]))
  detail = [body[i] for i in keep if body[i] not in {body[j] for j in keep if j > i}]  # a repeat: its last
  if causes:
    detail.append(err)
  if steps:
    earlier = [(lines[max(i for i in steps if i < j)], x) for j, x in enumerate(lines[:steps[-1]])
               if _UNREACHED.search(x) and any(i < j for i in steps)]
    if earlier:  # the cause may be there, not in the failing step
      st, x = earlier[-1]
      detail.append(f"an earlier step could not reach a host: {x.strip()} ({_clip(st, 120)})")
  budget, tail = REASON_MAX_CHARS - len(head), []
  for x in reversed(detail):
    if len(x) + 5 > budget:
      break
    tail.insert(0, "  | " + x)
    budget -= len(x) + 5
  return "\n".join([head, *tail])


def build_task_image(client, task: Task, image_map: Mapping[str, str] = {}, network: str = "none",
                     ca_bundle: str | None = None) -> str:
  """Build (or reuse) the task's image; returns its tag. Raises SandboxError(build_failed) with the reason: the
  task's own Dockerfile line (whatever lines the build adds) and the lines of the build's output that say why.
  ``ca_bundle``: a PEM file the build's RUN steps trust (see :func:`with_build_ca`). A build with a network
  also fetches what the verifier script installs at test time (:mod:`rsi_jax.env.verifier_deps`). The
  context's links are copied as links; one that leaves the context is refused."""
  try:
    tag, dockerfile_text, _ = task_image_tag(client, task, image_map, ca_bundle, verifier_deps=network != "none")
  except docker.errors.DockerException as e:
    raise SandboxError(DOCKER_ERROR, f"{task.name}: {e}") from None
  key = f"{client.api.base_url} {tag}"
  with _BUILD_LOCKS_LOCK:
    lock = _BUILD_LOCKS.setdefault(key, threading.Lock())
  with lock:
    failed = _FAILED_BUILDS.get(key)
    if failed is not None:  # this exact build failed before in this process: not retried per episode
      raise SandboxError(BUILD_FAILED, failed + " (cached: the same build failed earlier in this run)")
    if _image_exists(client, tag):
      return tag
    t0 = time.time()
    own_count = len(task.dockerfile.read_text().rstrip("\n").split("\n"))
    origin = _own_lines(dockerfile_text, own_count, ca_bundle is not None)
    with tempfile.TemporaryDirectory(prefix="rsi-build-") as tmp:
      for f in _context_files(task):
        dst = Path(tmp) / f.relative_to(task.context_dir)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if f.is_symlink():
          os.symlink(os.readlink(f), dst)
        else:
          shutil.copy2(f, dst)
      _check_links(task, Path(tmp))
      for name in ("Dockerfile", CA_IN_CONTEXT):  # written below, never through a link of the task's
        if (Path(tmp) / name).is_symlink():
          (Path(tmp) / name).unlink()
      (Path(tmp) / "Dockerfile").write_text(dockerfile_text)
      if ca_bundle:
        shutil.copyfile(ca_bundle, Path(tmp) / CA_IN_CONTEXT)
      try:
        client.images.build(path=tmp, dockerfile="Dockerfile", tag=tag, rm=True, forcerm=True,
                            network_mode=network, labels={LABEL_TASK: task.name},
                            timeout=int(task.build_timeout_s))
      except docker.errors.BuildError as e:
        msg = _build_failure(task, list(e.build_log), e.msg, dockerfile_text, origin)
        _FAILED_BUILDS[key] = msg
        raise SandboxError(BUILD_FAILED, msg) from None
      except docker.errors.APIError as e:
        why = " ".join(str(e.explanation or e).split())
        m = re.search(r"(?i)dockerfile parse error (?:on )?line (\d+): (.*)", why)
        if m:
          where = _where(task, origin, int(m.group(1))) or f"{task.dockerfile}"
          why = f"{where}: Dockerfile parse error: {m.group(2)}"
        msg = f"{task.name}: {why}" if m else f"{task.name}: image build failed: {why}"
        if e.is_client_error():  # the daemon refused this build as written: not retried per episode
          _FAILED_BUILDS[key] = msg
        raise SandboxError(BUILD_FAILED, msg) from None
      except docker.errors.DockerException as e:
        raise SandboxError(BUILD_FAILED, f"{task.name}: {e}") from None
    log.info("built %s for task %s in %.1fs", tag, task.name, time.time() - t0)
    return tag


# ---------------------------------------------------------------------------------------------- teardown

_LIVE: dict[str, "DockerSandbox"] = {}
_LIVE_LOCK = threading.Lock()


def _remove_all_live():
  with _LIVE_LOCK:
    boxes = list(_LIVE.values())
  for b in boxes:
    b.close()


atexit.register(_remove_all_live)


def install_signal_handlers():
  """Turn SIGTERM into SystemExit so ``finally`` / ``with`` teardown runs (SIGINT already raises
  KeyboardInterrupt). Only possible from the main thread; a no-op elsewhere."""
  if threading.current_thread() is not threading.main_thread():
    return

  def _raise(signum, frame):
    raise SystemExit(128 + signum)

  if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
    signal.signal(signal.SIGTERM, _raise)


def reap_containers(client, run_id: str | None = None) -> int:
  """Remove every container labelled by rsi_jax (or by one run). Returns how many were removed."""
  label = LABEL_RUN if run_id is None else f"{LABEL_RUN}={run_id}"
  n = 0
  for c in client.containers.list(all=True, filters={"label": label}, ignore_removed=True):
    try:
      c.remove(force=True)
      n += 1
    except docker.errors.NotFound:
      pass
  return n


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def reap_orphans(client) -> int:
  """Remove labelled containers whose owning process (on this host) no longer runs: what crashed runs
  left behind. Containers owned by live processes or other hosts are kept."""
  n = 0
  me = socket.gethostname()
  for c in client.containers.list(all=True, filters={"label": LABEL_RUN}, ignore_removed=True):
    labels = c.labels or {}
    try:
      pid = int(labels.get(LABEL_PID, "0"))
    except ValueError:
      pid = 0
    if labels.get(LABEL_HOST) == me and pid > 0 and _pid_alive(pid):
      continue
    if labels.get(LABEL_HOST) not in (me, None):
      continue
    try:
      c.remove(force=True)
      n += 1
    except docker.errors.NotFound:
      pass
  if n:
    log.warning("removed %d container(s) left by crashed runs", n)
  return n


def prune_task_images(client, keep_latest: bool = True) -> list[str]:
  """Remove task images (``rsi-task-<name>:<content hash>``) no container uses: with ``keep_latest`` all
  but the newest of each task (the ones of earlier task versions and base images), else all of them.
  Returns the removed tags."""
  in_use = {c.image.id for c in client.containers.list(all=True, ignore_removed=True)}
  by_task: dict[str, list] = {}
  for img in client.images.list():
    for tag in img.tags:
      if tag.startswith(TASK_IMAGE_PREFIX):
        by_task.setdefault(tag.rsplit(":", 1)[0], []).append((img.attrs.get("Created", ""), tag, img.id))
  removed = []
  for _, imgs in sorted(by_task.items()):
    imgs.sort(reverse=True)
    for _, tag, iid in imgs[1 if keep_latest else 0:]:
      if iid in in_use:
        continue
      try:
        client.images.remove(tag)
        removed.append(tag)
      except docker.errors.DockerException as e:
        log.warning("could not remove %s: %s", tag, e)
  return removed


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
    self.disk_limit_bytes = disk_limit_bytes  # checked after every command (None: unlimited)
    self.container = None
    self.start_latency_s = None
    self._n = 0
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

  # -- commands

  def run(self, command: str, timeout_s: float | None = None) -> CommandResult:
    """Run one agent command in the persistent shell (cwd and exported variables carry over); then the
    container's writes are held against its storage limit (:meth:`check_disk`)."""
    res = self._run(command, timeout_s)
    self.check_disk()
    return res

  def disk_used(self) -> int:
    """Bytes the container has written (its writable layer, ``docker ps --size``)."""
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
          ["/bin/bash", "-c", _SHELL_SCRIPT, "bash", str(n), f"{timeout_s:g}",
           str(self.output_cap_bytes)], environment={"RSI_CMD": command}, demux=False)
    except docker.errors.DockerException as e:
      self._check_alive("a command")
      raise SandboxError(DOCKER_ERROR, f"exec failed: {e}") from None
    finally:
      backstop.cancel()
    dt = time.time() - t0
    out = res.output or b""
    end = out.rfind(_END)
    if end < 0:
      # The shell was killed: by its watchdog (timeout), by the agent itself, or with the container.
      self._check_alive("a command")
      col = self.exec_raw(["/bin/bash", "-c", _COLLECT_SCRIPT, "bash", str(n), str(self.output_cap_bytes)],
                          timeout_s=30)
      status, _, out = col.output.partition("\n")
      if status == "TIMEOUT":
        msg = f"\n[command timed out after {timeout_s:g}s and was killed]"
        return CommandResult(out + msg, 124, True, dt)
      # Killed, not by its watchdog: when the container is being killed, its processes die before its
      # status changes, so look again after a moment.
      time.sleep(0.5)
      self._check_alive("a command")
      return CommandResult(out, 137, False, dt)
    code = int(out[end + len(_END):].rstrip(b"\x1e") or res.exit_code or 0)
    return CommandResult(out[:end].decode("utf-8", "replace"), code, False, dt)

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
    process group is killed at the timeout."""
    environment = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "HOME": "/root", "RSI_TIMEOUT": f"{timeout_s:g}"}
    environment.update(env or {})
    t0 = time.time()
    try:
      res = self.container.exec_run(["/bin/bash", "-c", _RAW_SCRIPT, "bash", *argv],
                                    environment=environment, workdir=workdir, demux=False)
    except docker.errors.DockerException as e:
      self._check_alive(argv[0])
      raise SandboxError(DOCKER_ERROR, f"exec failed: {e}") from None
    dt = time.time() - t0
    out = (res.output or b"")
    if cap_bytes is not None and len(out) > cap_bytes:
      out = out[:cap_bytes // 2] + b"\n[... output elided ...]\n" + out[-(cap_bytes - cap_bytes // 2):]
    code = 137 if res.exit_code is None else int(res.exit_code)
    killed = code == 137
    timed_out = killed and dt >= timeout_s - 0.5
    if killed and not timed_out:
      time.sleep(0.5)  # (see run: a container being killed still shows as running for a moment)
      self._check_alive(argv[0])
    return CommandResult(out.decode("utf-8", "replace"), code, timed_out, dt)

  # -- files

  def put_files(self, files: Mapping[str, bytes | str | Path], mode: int = 0o644):
    """Write files into the container: {absolute container path: content bytes/str or a host Path}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
      for dst, src in files.items():
        if isinstance(src, Path):
          data, m = src.read_bytes(), src.stat().st_mode & 0o777
        else:
          data, m = (src.encode() if isinstance(src, str) else src), mode
        info = tarfile.TarInfo(dst.lstrip("/"))
        info.size, info.mode, info.mtime = len(data), m, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    self._put_archive(buf.getvalue())

  def put_dir(self, host_dir: str | Path, container_dir: str, extra: Iterable[Path] = ()):
    """Copy a host folder's content (and extra files) into ``container_dir`` (created, modes kept)."""
    host_dir = Path(host_dir)
    buf = io.BytesIO()
    base = container_dir.strip("/")
    with tarfile.open(fileobj=buf, mode="w") as tar:
      tar.add(host_dir, arcname=base, recursive=True, filter=_root_owned)
      for f in extra:
        tar.add(f, arcname=f"{base}/{Path(f).name}", filter=_root_owned)
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
    2 deleted}]."""
    try:
      return list(self.container.diff() or [])
    except docker.errors.DockerException as e:
      self._check_alive("a diff")
      raise SandboxError(DOCKER_ERROR, f"diff failed: {e}") from None


def _root_owned(ti: tarfile.TarInfo) -> tarfile.TarInfo:
  ti.uid = ti.gid = 0
  ti.uname = ti.gname = "root"
  return ti
