"""Checks the backup archive: readable with the right member names, complete, and filtered (3 checks)."""

import hashlib
import tarfile
from pathlib import Path

ARCHIVE = Path("/app/backup.tar.gz")
# Files that must be in the archive: member name -> sha256 of the original content.
KEPT = {
  "project/.env": "b64e877ae5c83152d48d0500120ff199b14b0793ddadaab50a353e4eb4b492c1",
  "project/README.md": "c3c183ff63b252974d72040d527f4dd4b3ed5ce604373f8c75f6392f7aec6b08",
  "project/build/output.bin": "5915f0e0d7612c3b0000373fae4cdef9ec23f7dea2705e6a5fd220e8e47a794c",
  "project/docs/guide.md": "eecab5ab9c073a9625029f44f361f891c1716c407be2148932350efa363e0671",
  "project/docs/tmp-notes.md": "9b4c65f709680878caf9c8bbf9f590d129ef81aa1b870b1fd94e6de720eb5e50",
  "project/src/main.py": "6966e8c1892e33d8602ad70d27b47e096eea293a22f70f9de38a1f008571e651",
  "project/src/util.py": "dc742e20f8d76e64de8ea8541a2a70eef2b70f1526895cbbd88f4d81b7fb2a03",
}


def members():
  with tarfile.open(ARCHIVE, "r:gz") as tar:
    return {m.name.rstrip("/").removeprefix("./"): (m, tar.extractfile(m).read() if m.isfile() else None)
            for m in tar.getmembers()}


def test_archive_is_gzip_tar_with_project_prefix():
  assert ARCHIVE.is_file(), "/app/backup.tar.gz is missing"
  with open(ARCHIVE, "rb") as f:
    assert f.read(2) == b"\x1f\x8b", "archive is not gzip-compressed"
  names = members()
  assert names, "archive is empty"
  for name in names:
    assert name == "project" or name.startswith("project/"), f"member {name!r} is outside project/"


def test_archive_holds_every_kept_file_unchanged():
  names = members()
  for name, digest in KEPT.items():
    assert name in names, f"{name} is missing from the archive"
    member, data = names[name]
    assert member.isfile(), f"{name} is not a regular file in the archive"
    assert hashlib.sha256(data).hexdigest() == digest, f"{name} content differs"


def test_archive_leaves_out_tmp_files_and_caches():
  for name in members():
    assert not name.endswith(".tmp"), f"{name} should have been excluded"
    assert "__pycache__" not in name.split("/"), f"{name} should have been excluded"
  # The project itself must be untouched.
  assert Path("/app/project/notes.tmp").is_file()
  assert Path("/app/project/src/__pycache__/util.cpython-311.pyc").is_file()
