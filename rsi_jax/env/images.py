"""Task images: each task's image built (or reused) from its folder, with its build CA bundle and reasons.

The tag hashes the build context, the rewritten Dockerfile and the base images' ids
(:func:`task_image_tag`); :func:`build_task_image` builds it once per process and endpoint, a failed build's
reason naming the task's own Dockerfile line and the output lines that say why; :func:`with_build_ca` makes
the build's RUN steps trust the host's CA bundle; :func:`prune_task_images` removes old task images.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import docker
import docker.errors

from rsi_jax.env.dockerfiles import _FROM, rewrite_dockerfile
from rsi_jax.env.reaper import LABEL_TASK
from rsi_jax.env.sandbox import BUILD_FAILED, DOCKER_ERROR, SandboxError
from rsi_jax.env.tasks import Task

log = logging.getLogger(__name__)

TASK_IMAGE_PREFIX = "rsi-task-"

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
