"""Checks the permission bits of the site tree (3 checks)."""

import stat
from pathlib import Path

SITE = Path("/app/site")
DIRS = ["", "css", "bin", "img", "private"]
FILES = {  # relative path -> (expected mode, expected content)
  "index.html": (0o644, b"<html><body>hello</body></html>\n"),
  "css/style.css": (0o644, b"body { color: #333; }\n"),
  "bin/README": (0o644, b"Scripts used by the operators.\n"),
  "img/logo.gif": (0o644, b"GIF89a placeholder\n"),
  "bin/deploy.sh": (0o755, b"#!/bin/sh\necho deploying\n"),
  "bin/backup.sh": (0o755, b"#!/bin/sh\necho backing up\n"),
  "private/key.pem": (0o600, b"not really a key\n"),
  "private/htpasswd": (0o600, b"user:secret\n"),
}


def mode(path: Path) -> int:
  return stat.S_IMODE(path.lstat().st_mode)


def test_directory_modes():
  for rel in DIRS:
    path = SITE / rel
    assert path.is_dir(), f"{path} is missing"
    want = 0o700 if rel == "private" else 0o755
    assert mode(path) == want, f"{path}: {oct(mode(path))} != {oct(want)}"


def test_ordinary_files_are_644_and_unchanged():
  for rel, (want, content) in FILES.items():
    path = SITE / rel
    assert path.is_file(), f"{path} is missing"
    assert path.read_bytes() == content, f"{path} was edited"
    if want == 0o644:
      assert mode(path) == want, f"{path}: {oct(mode(path))} != 0o644"


def test_scripts_are_755_and_private_files_600():
  for rel, (want, _) in FILES.items():
    if want != 0o644:
      path = SITE / rel
      assert mode(path) == want, f"{path}: {oct(mode(path))} != {oct(want)}"
