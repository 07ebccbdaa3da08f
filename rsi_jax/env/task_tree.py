"""A task folder's tree, checked before anything in it is read: names, kinds of entry, symbolic links.

An untrusted task folder (:func:`rsi_jax.env.tasks.load_task`) is refused for a name that is not UTF-8, an entry
that is neither a regular file, a folder nor a link, and a symbolic link that leaves the folder (absolute,
through ``..`` or through a chain of links) or leads nowhere.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


def is_utf8(name: str) -> bool:
  """Whether the file name ``name`` (as ``os`` decodes it, undecodable bytes as surrogates) is UTF-8."""
  try:
    name.encode("utf-8")
    return True
  except UnicodeEncodeError:
    return False


def show_name(name: str) -> str:
  """A file name for a message: bytes that are not UTF-8 as ``\\xNN``."""
  return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _inside(p: str, root: str) -> bool:
  return p == root or p.startswith(root.rstrip(os.sep) + os.sep)


def tree_problems(root: Path, errors: list[str]) -> bool:
  """Append what makes the folder unsafe or unreadable to ``errors``: names that are not UTF-8, entries that are
  not regular files, folders or links, and links that leave ``root`` or lead nowhere. True when a link leaves
  it (the folder is then not read further)."""
  base, escapes = str(root), False
  for dirpath, dirnames, filenames in os.walk(base):  # links are listed, never followed
    for name in sorted(dirnames + filenames):
      p = os.path.join(dirpath, name)
      rel = show_name(os.path.relpath(p, base))
      if not is_utf8(name):
        errors.append(f"file name is not UTF-8: {rel}")
      if os.path.islink(p):
        why = _link_problem(p, base, rel)
        if why:
          errors.append(why)
          escapes = escapes or "leaves the task folder" in why
      elif not (os.path.isfile(p) or os.path.isdir(p)):
        errors.append(f"{rel} is not a regular file, a folder or a link")
  return escapes


def _link_problem(link: str, root: str, rel: str) -> str | None:
  """Why the symbolic link ``link`` cannot be used (None: it resolves inside ``root``). Each link of a chain is
  followed by its own text and must stay inside, and so must the path the kernel resolves."""
  target, cur = show_name(os.readlink(link)), link
  for _ in range(40):
    hop = os.readlink(cur)
    nxt = os.path.normpath(os.path.join(os.path.dirname(cur), hop))
    if not _inside(nxt, root):
      via = "" if cur == link else f" (through {show_name(os.path.relpath(cur, root))} -> {show_name(hop)})"
      return f"symlink {rel} -> {target} leaves the task folder{via}"
    if not os.path.islink(nxt):
      break
    cur = nxt
  else:
    return f"symlink {rel} -> {target} is a loop of links"
  try:
    real = os.path.realpath(link, strict=True)
  except OSError as e:
    what = "a loop of links" if e.errno == errno.ELOOP else "dangling (its target does not exist)"
    return f"symlink {rel} -> {target} is {what}"
  if not _inside(real, root):
    return f"symlink {rel} -> {target} leaves the task folder (resolves to {show_name(real)})"
  return None
