"""A container's writable layer read on this host: its size and its changes, as the daemon would give them.

Where the Docker daemon runs on this host with the overlay2 storage driver, a container's writable layer is a
folder here (``UpperDir``) over the image's layers (``LowerDir``). Reading it directly answers the two questions
the environment asks after every command or episode far faster than the daemon does: how many bytes the
container wrote (``docker ps --size`` also walks the whole image) and what it changed (``docker diff`` takes
about half a second per call: it compares the whole container tree with the whole image). Both give what the
daemon gives (tests/env/test_overlay.py compares them on real containers); anything unreadable raises OSError
and the caller asks the daemon instead.
"""

from __future__ import annotations

import os
import stat

import docker.errors

KIND_MODIFIED, KIND_ADDED, KIND_DELETED = 0, 1, 2  # docker diff's kinds
OPAQUE_XATTR = "trusted.overlay.opaque"


def local_layers(client, container) -> tuple[str, tuple[str, ...]] | None:
  """``(upper, lowers)``: the container's writable layer and the image layers under it (top first), as folders
  this process can read; None when the daemon is not on this host, uses another storage driver, or the
  folders cannot be read."""
  try:
    if not str(client.api.base_url).startswith("http+docker://"):  # a unix socket: the daemon is on this host
      return None
    container.reload()
    if container.attrs.get("Driver") != "overlay2":
      return None
    d = (container.attrs.get("GraphDriver") or {}).get("Data") or {}
    upper, lowers = d.get("UpperDir"), tuple(x for x in (d.get("LowerDir") or "").split(":") if x)
    if not upper or not all(os.path.isdir(p) for p in (upper, *lowers)):
      return None
    tree_bytes(upper)  # readable all the way down, or the daemon measures
    return upper, lowers
  except (OSError, docker.errors.DockerException):
    return None


def _walk(root: str, rel: str = ""):
  """``(relative path, lstat)`` of everything under ``root`` in the daemon's order (depth first, each folder
  before its contents, names in byte order; links not followed). A folder that cannot be read raises OSError
  (nothing may be missed); one removed while the walk runs is skipped."""
  try:
    names = sorted(os.listdir(os.path.join(root, rel) if rel else root))
  except FileNotFoundError:
    if not rel:
      raise  # the layer itself is gone (the container was removed): not "no changes"
    return
  for name in names:
    p = f"{rel}/{name}" if rel else name
    try:
      st = os.lstat(os.path.join(root, p))
    except FileNotFoundError:
      continue
    yield p, st
    if stat.S_ISDIR(st.st_mode):
      yield from _walk(root, p)


def tree_bytes(root: str) -> int:
  """Sum of the sizes of the non-folder entries under ``root`` (links not followed), as the daemon counts a
  writable layer (``SizeRw``); a folder that cannot be read raises OSError (an undercount would let a container
  past its limit)."""
  return sum(st.st_size for _, st in _walk(root) if not stat.S_ISDIR(st.st_mode))


def overlay_changes(upper: str, lowers: tuple[str, ...]) -> list[dict]:
  """``docker diff`` of a container from its layers: ``[{"Path": p, "Kind": 0 modified | 1 added |
  2 deleted}]``, by the daemon's own rules (moby ``pkg/archive`` ``ChangesDirs``, the tree comparison its
  overlay2 driver uses): the container's tree against the image's, an entry modified when its type, mode,
  owner, device, file capabilities or (not for folders) size or time differ, a deleted or added folder listed
  alone or with each of its entries added, and every folder holding a change listed as modified. Only what the
  writable layer holds can differ from the image, so only that is walked; the image's side is looked up
  through its layers (whiteouts and opaque folders included)."""
  out: list[dict] = []

  def visit_dir(rel: str, opaque: bool, old_is_dir: bool):
    seen = set()
    for name in sorted(os.listdir(os.path.join(upper, rel) if rel else upper)):
      p = f"{rel}/{name}" if rel else name
      try:
        st = os.lstat(os.path.join(upper, p))
      except FileNotFoundError:
        continue
      seen.add(name)
      old = _image_entries(lowers, p) if old_is_dir else []
      if _whiteout(st):
        if old:
          out.append({"Path": "/" + p, "Kind": KIND_DELETED})
        continue
      visit(p, st, old[0] if old else None)
    if opaque and old_is_dir:  # the image's entries the folder no longer shows
      for name in sorted(_image_children(lowers, rel) - seen):
        out.append({"Path": f"/{rel}/{name}" if rel else f"/{name}", "Kind": KIND_DELETED})

  def visit(p: str, st: os.stat_result, old: tuple[str, os.stat_result] | None):
    start, is_dir = len(out), stat.S_ISDIR(st.st_mode)
    if old is None:
      out.append({"Path": "/" + p, "Kind": KIND_ADDED})
      if is_dir:
        out.extend({"Path": f"/{p}/{q}", "Kind": KIND_ADDED}
                   for q, s in _walk(os.path.join(upper, p)) if not _whiteout(s))
      return
    listed = _stat_different(old[1], st) or _capability(old[0]) != _capability(os.path.join(upper, p))
    if listed:
      out.append({"Path": "/" + p, "Kind": KIND_MODIFIED})
    if is_dir:
      visit_dir(p, _opaque(os.path.join(upper, p)), stat.S_ISDIR(old[1].st_mode))
      if len(out) > start and not listed:
        out.insert(start, {"Path": "/" + p, "Kind": KIND_MODIFIED})

  visit_dir("", False, True)
  return out


def _image_entries(lowers: tuple[str, ...], rel: str) -> list[tuple[str, os.stat_result]]:
  """The image layers' entries that make up ``rel`` in the image (top first): none when the image does not have
  it, one for a non-folder, each layer's folder (down to an opaque one) for a folder."""
  out: list[tuple[str, os.stat_result]] = []
  parts = rel.split("/") if rel else []
  for layer in lowers:
    here, blocked, st = layer, False, None
    for i, part in enumerate(parts):
      here = os.path.join(here, part)
      try:
        st = os.lstat(here)
      except (FileNotFoundError, NotADirectoryError):
        st = None
        break
      if _whiteout(st) or (i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode)):
        return out  # deleted or replaced by this layer: hidden below it too
      if i < len(parts) - 1 and _opaque(here):
        blocked = True  # lower layers show nothing under this folder
    if not parts:
      st = os.lstat(layer)
    if st is not None:
      if out and not stat.S_ISDIR(st.st_mode):
        return out  # a folder above hides a non-folder below
      out.append((here, st))
      if not stat.S_ISDIR(st.st_mode) or _opaque(here):
        return out
    if blocked:
      return out
  return out


def _image_children(lowers: tuple[str, ...], rel: str) -> set[str]:
  names, hidden = set(), set()
  for folder, st in _image_entries(lowers, rel):
    if not stat.S_ISDIR(st.st_mode):
      break
    for name in os.listdir(folder):
      if name in names or name in hidden:
        continue
      (hidden if _whiteout(os.lstat(os.path.join(folder, name))) else names).add(name)
  return names


def _whiteout(st: os.stat_result) -> bool:
  return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _stat_different(old: os.stat_result, new: os.stat_result) -> bool:
  # moby's statDifferent: size and time are not compared for folders
  if (old.st_mode, old.st_uid, old.st_gid, old.st_rdev) != (new.st_mode, new.st_uid, new.st_gid, new.st_rdev):
    return True
  return not stat.S_ISDIR(old.st_mode) and (old.st_size != new.st_size or not _same_time(old, new))


def _capability(path: str) -> bytes:
  try:
    return os.getxattr(path, "security.capability", follow_symlinks=False)
  except OSError:
    return b""


def _opaque(path: str) -> bool:
  try:
    return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
  except OSError:
    return False


def _same_time(a: os.stat_result, b: os.stat_result) -> bool:
  # moby's sameFsTimeSpec: equal in seconds, and in nanoseconds unless either side has none
  if a.st_mtime_ns == b.st_mtime_ns:
    return True
  sa, na = divmod(a.st_mtime_ns, 1_000_000_000)
  sb, nb = divmod(b.st_mtime_ns, 1_000_000_000)
  return sa == sb and (na == 0 or nb == 0)
