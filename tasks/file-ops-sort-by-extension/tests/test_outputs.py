"""Checks that the inbox files were moved into per-extension folders unchanged (3 checks)."""

import hashlib
from pathlib import Path

APP = Path("/app")
# name -> (expected folder, sha256 of the original content)
EXPECTED = {
  "LICENSE": ("noext", "9ccdd4bbc5e4059c566bd9b65eabc60258f3e3904391a0f2a2754161c72e9972"),
  "Makefile": ("noext", "5aa7dd748ab9820437f87661507d87bec6c8d9442205a93de7d58c002c8c67fd"),
  "Notes.TXT": ("txt", "2ec4aa86ca5e6b27f98c2ce9ff7fb942d2f83f3ea1b4473765878a34f79ba02c"),
  "README.md": ("md", "86c14fc186fb08f52000613ef3f7cb891fd9260cb425ba4d4e3757f780dfe8ba"),
  "archive.2023.log": ("log", "28d0e87a7f551e2df1eecce29ea5e6fe3971b1b3def94a68d6ccd94a15cea7ad"),
  "cities.CSV": ("csv", "b01c13420685942631019e98fd3ded881800e54473e9ad8d44d9c0a5378e5ec1"),
  "prices.csv": ("csv", "be82f921b750daac2544dc39af8971a9839ab5e6d7b6e357f30a3a172b14025c"),
  "server.log": ("log", "edb6e1e3e29b6da6a29b328050a1ac8f6599de9e8217c8b19069eb5153e0b5ae"),
  "settings.json": ("json", "3d894b10046735036570c7f7c0d1256f37ec9f62447a1d89db12782f1e4429d5"),
  "todo.txt": ("txt", "05ca71b7117d8b78f2adc4ca48bfcfbcebab35eb64fa2da9474c78e492ca9af5"),
}


def sha256(path: Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_file_is_in_its_extension_folder_unchanged():
  for name, (ext, digest) in EXPECTED.items():
    path = APP / "sorted" / ext / name
    assert path.is_file() and not path.is_symlink(), f"{path} is missing"
    assert sha256(path) == digest, f"{path} content changed"


def test_inbox_exists_and_is_empty():
  inbox = APP / "inbox"
  assert inbox.is_dir(), "/app/inbox must still exist"
  assert list(inbox.iterdir()) == [], "/app/inbox is not empty"


def test_sorted_holds_nothing_else():
  found = {str(p.relative_to(APP / "sorted")) for p in (APP / "sorted").rglob("*") if not p.is_dir()}
  wanted = {f"{ext}/{name}" for name, (ext, _) in EXPECTED.items()}
  assert found == wanted
  dirs = {p.name for p in (APP / "sorted").iterdir()}
  assert dirs == {ext for ext, _ in EXPECTED.values()}
