"""Dockerfile reading: the base images a Dockerfile names, their local stand-ins, FROM rewrites, COPY layout.

Upstream base images are unreachable here (no registry), so :func:`resolve_base_image` rewrites a ``FROM``
that is not available locally through the configured image map (glob patterns, first match wins). The built-in
map covers only what the local image family stands for (the official distribution, python and buildpack-deps
images, the Terminal-Bench ``python-3-13`` / ``ubuntu-24-04`` base images); a task-specific image only a
registry has (a TB1 ``t-bench/<task>`` image, SWE-bench's per-instance images) is refused (``registry_only``,
:func:`image_check`), never replaced.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path

log = logging.getLogger(__name__)

# Upstream base images -> the local image family (scripts/build_base_image.sh): (glob on the canonical
# reference, suite, build tools?), first match wins; env.image_map entries take precedence. Each suite gives
# what the upstream image has: the distribution release (Ubuntu 24.04 -> noble) or, for python:*, the
# Python version (3.13 -> trixie, 3.12 -> noble, 3.11 -> bookworm, 3.10 -> jammy); full python and
# buildpack-deps images have compilers and headers (the -build variant), -slim ones do not. Nothing else is
# mapped: an image of a task's own (TB1 t-bench/<task>, SWE-bench per-instance) is refused, not replaced.
_PYTHON_SUITES = (("3.14", "trixie"), ("3.13", "trixie"), ("3.12", "noble"), ("3.11", "bookworm"),
                  ("3.10", "jammy"), ("3.[0-9]", "bookworm"), ("3", "trixie"), ("latest", "trixie"))
DEFAULT_IMAGE_MAP: tuple[tuple[str, str, bool], ...] = (
    *((p, "noble", False) for p in ("ubuntu:24.04*", "ubuntu:noble*", "ubuntu:2[4-9].*", "ubuntu:latest",
                                     "ubuntu:rolling", "ubuntu:devel")),
    ("ubuntu:*", "jammy", False),  # 22.04 and older
    *((p, "trixie", False) for p in ("debian:trixie*", "debian:13*", "debian:testing*", "debian:sid*",
                                      "debian:unstable*", "debian:latest", "debian:stable*")),
    ("debian:*", "bookworm", False),
    *((p, "noble", True) for p in ("buildpack-deps:noble*", "buildpack-deps:24.04*")),
    *((p, "jammy", True) for p in ("buildpack-deps:jammy*", "buildpack-deps:22.04*", "buildpack-deps:focal*",
                                    "buildpack-deps:20.04*", "buildpack-deps:bionic*")),
    *((p, "trixie", True) for p in ("buildpack-deps:trixie*", "buildpack-deps:testing*", "buildpack-deps:sid*",
                                     "buildpack-deps:latest", "buildpack-deps:stable*")),
    ("buildpack-deps:*", "bookworm", True),
    *(x for v, suite in _PYTHON_SUITES for x in ((f"python:{v}*slim*", suite, False),
                                                  (f"python:{v}*", suite, True))),
    ("python:slim*", "trixie", False),
    ("ghcr.io/laude-institute/t-bench/python-3-13:*", "trixie", False),
    ("ghcr.io/laude-institute/t-bench/ubuntu-24-04:*", "noble", False),
)
REGISTRY_ONLY = "registry_only"  # the refusal of a task whose base image only a registry has


def dockerfile_layout(text: str) -> tuple[str, list[tuple[str, str]]]:
  """WORKDIR (the last one; /app if none) and (source, destination) of every COPY / ADD (shell form, quoted
  arguments included, or JSON form;
  a relative destination is resolved against the WORKDIR; a destination that holds several sources gets a
  trailing slash). ``--from`` copies (other build stages) are left out."""
  workdir, copies = "/app", []
  text = re.sub(r"\\\n", " ", text)
  for line in text.splitlines():
    words = line.strip().split(None, 1)
    if not words:
      continue
    op, rest = words[0].upper(), (words[1] if len(words) > 1 else "")
    if op == "WORKDIR" and rest:
      d = rest.strip().strip('"')
      workdir = d if d.startswith("/") else workdir.rstrip("/") + "/" + d
    elif op in ("COPY", "ADD") and "--from" not in rest:
      rest = re.sub(r"^(--\S+\s+)+", "", rest.strip())
      try:  # JSON form, or shell form with its quotes read as the shell reads them
        args = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
      except ValueError:
        args = rest.split()
      args = [str(a) for a in args]
      if len(args) >= 2:
        raw = args[-1]
        dst = os.path.normpath(raw if raw.startswith("/") else workdir.rstrip("/") + "/" + raw)
        if raw.endswith("/") or raw in (".", "./") or len(args) > 2:
          dst = dst.rstrip("/") + "/"
        copies += [(src, dst) for src in args[:-1]]
  return workdir, copies


def family_image(base_image: str, suite: str, build: bool = False) -> str:
  """The local image scripts/build_base_image.sh builds for ``suite`` (``bookworm`` -> ``rsi-base``,
  ``noble`` -> ``rsi-base-noble``, with build tools ``rsi-base-noble-build``)."""
  name = base_image if suite == "bookworm" else f"{base_image}-{suite}"
  return f"{name}-build" if build else name


def family_spec(image: str, base_image: str = "rsi-base") -> str:
  """The build_base_image.sh argument that builds the family ``image`` (``rsi-base-noble-build`` ->
  ``noble-build``)."""
  rest = image.split(":", 1)[0][len(base_image):].lstrip("-")
  build = rest.endswith("build")
  suite = rest[:-len("build")].rstrip("-") if build else rest
  return (suite or "bookworm") + ("-build" if build else "")


def effective_image_map(image_map: Mapping[str, str], base_image: str = "rsi-base") -> dict:
  """The configured map first (first match wins), then :data:`DEFAULT_IMAGE_MAP`. A default entry's value is
  (family image, ``base_image``): the family image where it is built, else ``base_image`` (with a warning
  naming the command that builds the family image; see :func:`resolve_base_image`)."""
  out: dict = dict(image_map)
  for pattern, suite, build in DEFAULT_IMAGE_MAP:
    target = family_image(base_image, suite, build)
    out.setdefault(pattern, target if target == base_image else (target, base_image))
  return out


_FROM = re.compile(r"^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE)


def resolve_base_image(image: str, image_map: Mapping[str, str],
                       is_local: Callable[[str], bool]) -> str:
  """The image to build FROM: ``image`` if available locally, else the first ``image_map`` glob match.

  References are matched in their canonical short form too (:func:`canonical_image`: registry mirrors of
  the official images, ``docker.io/library/``, a digest and a missing tag removed), so ``ubuntu``,
  ``docker.io/library/ubuntu:24.04`` and ``public.ecr.aws/docker/library/python:3.12@sha256:...`` all
  meet the ``ubuntu:*`` / ``python:3*`` entries. An image with no match is returned unchanged (the build then
  fails naming it; :func:`image_check` refuses such a task before that)."""
  if is_local(image):
    return image
  target = _mapped(image, image_map)
  if isinstance(target, tuple):  # (family image, fallback): the family image unless it is not built
    return target[0] if is_local(target[0]) or not is_local(target[1]) else target[1]
  return image if target is None else target


def base_image_problems(tasks, image_map: Mapping[str, str], is_local: Callable[[str], bool]) -> dict:
  """{task name: [one line per ``FROM`` a build cannot satisfy as written]}: an image neither available
  locally nor mapped (``registry_only``: the task is refused, see :func:`image_check`), and one whose family
  image is not built (the fallback is used; the line names the command that builds it). Stage names and build
  arguments are left aside."""
  out: dict[str, list[str]] = {}
  for t in tasks:
    lines = []
    for image in dockerfile_images(Path(t.dockerfile).read_text(errors="replace")):
      if is_local(image):
        continue
      new = resolve_base_image(image, image_map, is_local)
      wanted = _mapped(image, image_map)
      if new == image:
        lines.append(registry_only_reason(image))
      elif isinstance(wanted, tuple) and new != wanted[0]:
        lines.append(f"base image {image} maps to {wanted[0]}, which is not built (bash "
                     f"scripts/build_base_image.sh {family_spec(wanted[0], wanted[1])}); using {new}")
    if lines:
      out[t.name] = lines
  return out


def dockerfile_images(text: str) -> list[str]:
  """The base images a Dockerfile names in its ``FROM`` lines, in order; earlier stages (``FROM a AS b`` then
  ``FROM b``) and references built from arguments (``$BASE``) are left out."""
  out, stages = [], set()
  for line in text.splitlines():
    m = _FROM.match(line)
    if not m:
      continue
    image, rest = m.group(3), m.group(4)
    if image.lower() not in stages and "$" not in image and image not in out:
      out.append(image)
    alias = re.match(r"\s+AS\s+(\S+)", rest, re.IGNORECASE)
    if alias:
      stages.add(alias.group(1).lower())
  return out


def registry_only_reason(image: str) -> str:
  """Why a task whose base image ``image`` is neither present locally nor mapped is refused (one line)."""
  ref = canonical_image(image)
  if ref.startswith("swebench/"):
    what = "a per-instance SWE-bench image (the repository at the issue's commit, with its environment)"
  elif ref.startswith("ghcr.io/laude-institute/t-bench/"):
    name = ref.removeprefix("ghcr.io/laude-institute/t-bench/").split(":")[0]
    what = f"the task-specific Terminal-Bench image t-bench/{name} (its own tools, which no local base image has)"
  else:
    what = "an image the local base image family does not stand for"
  return (f"{REGISTRY_ONLY}: base image {image} is {what}; only a registry has it, and it is neither present "
          f"locally nor mapped by env.image_map: refused, not replaced (load or build it on the Docker host, or "
          f"map it on purpose in env.image_map)")


def image_check(image_map: Mapping[str, str], is_local: Callable[[str], bool]) -> Callable[[str], str | None]:
  """For :func:`load_task`'s ``images``: a base image present locally, or mapped by ``image_map`` (the configured
  map over :data:`DEFAULT_IMAGE_MAP`), is fine; any other is refused (:func:`registry_only_reason`)."""
  seen: dict[str, str | None] = {}

  def check(image: str) -> str | None:
    if image not in seen:
      seen[image] = None if is_local(image) or _mapped(image, image_map) is not None else registry_only_reason(image)
    return seen[image]
  return check


def _mapped(image: str, image_map: Mapping[str, str]):
  short = canonical_image(image)
  return next((v for k, v in image_map.items() if fnmatch.fnmatchcase(image, k) or fnmatch.fnmatchcase(short, k)),
              None)


# Registry prefixes under which the official images are mirrored unchanged.
OFFICIAL_MIRRORS = ("docker.io/library/", "index.docker.io/library/", "registry-1.docker.io/library/",
                    "public.ecr.aws/docker/library/", "mirror.gcr.io/library/", "docker.io/", "library/")


def canonical_image(image: str) -> str:
  """``docker.io/library/python:3.12@sha256:ab...`` -> ``python:3.12``; ``ubuntu`` -> ``ubuntu:latest``."""
  ref = image.split("@", 1)[0]
  for prefix in OFFICIAL_MIRRORS:
    if ref.startswith(prefix):
      ref = ref[len(prefix):]
      break
  last = ref.rsplit("/", 1)[-1]
  return ref if ":" in last else ref + ":latest"


def rewrite_dockerfile(text: str, image_map: Mapping[str, str], is_local: Callable[[str], bool],
                       where: str = "Dockerfile") -> tuple[str, list[tuple[str, str]]]:
  """Rewrite every ``FROM`` through :func:`resolve_base_image`; stage names (``FROM a AS b``) are kept.

  Returns (new text, [(old image, new image), ...] for each rewrite)."""
  stages: set[str] = set()
  out, changes = [], []
  for line in text.splitlines(keepends=True):
    m = _FROM.match(line.rstrip("\n"))
    if m:
      head, flags, image, rest = m.groups()
      alias = re.match(r"\s+AS\s+(\S+)", rest, re.IGNORECASE)
      if image.lower() not in stages and "$" not in image:
        new = resolve_base_image(image, image_map, is_local)
        if new != image:
          changes.append((image, new))
          log.info("%s: base image %s is not available locally; using %s (env.image_map)", where, image, new)
          line = f"{head}{flags}{new}{rest}" + ("\n" if line.endswith("\n") else "")
      if alias:
        stages.add(alias.group(1).lower())
    out.append(line)
  return "".join(out), changes
