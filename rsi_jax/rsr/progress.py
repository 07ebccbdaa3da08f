"""The RSR funnel's progress, recorded as it goes: a resumed funnel continues where it stopped.

``<phase folder>/progress/<stage>/<index>.json.gz``, one record per finished unit of work, written the moment it
finishes: a discovery episode and a fresh execution (the whole episode, :mod:`rsi_jax.env.records`), a planning
call (the runbook text or why there is none). ``progress/key.json`` names what the records belong to (the
actor's digest, the task pool, the funnel's settings and templates); a funnel started with another key clears
them. Episodes aborted by a stop notice are not recorded (they are run again). A record cut by a kill is
unreadable and run again. Every unit of work is seeded by its own tag, so with ``rollout.deterministic`` a
resumed funnel ends with what an uninterrupted one gives.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
import time

from etils import epath

STAGES = ("discovery", "planning", "execution")
log = logging.getLogger(__name__)


class FunnelProgress:
  """The records of one funnel under ``workdir`` (see the module docstring). ``done[stage]``: index -> record."""

  def __init__(self, workdir: str, key: dict):
    self.dir = epath.Path(workdir) / "progress"
    self.seconds = 0.0  # spent writing records (their cost: the funnel's manifest reports it)
    self.t0 = time.time()  # when this attempt of the funnel started
    self._lock = threading.Lock()
    key_file = self.dir / "key.json"
    key = json.loads(json.dumps(key))
    if self.dir.exists() and (not key_file.exists() or _read_json(key_file) != key):
      self.dir.rmtree()  # records of another actor, task pool or setting: not this funnel's
    self.dir.mkdir(parents=True, exist_ok=True)
    if not key_file.exists():
      key_file.write_text(json.dumps(key, indent=1) + "\n")
    self.done = {s: self._read(s) for s in STAGES}
    self.restored = {s: len(v) for s, v in self.done.items()}

  def _read(self, stage: str) -> dict[int, dict]:
    d, out = self.dir / stage, {}
    if not d.exists():
      return out
    for f in d.iterdir():
      name = f.name[:-len(".json.gz")] if f.name.endswith(".json.gz") else ""
      if not name.isdigit():
        continue
      try:
        out[int(name)] = json.loads(gzip.decompress(f.read_bytes()))
      except (OSError, EOFError, ValueError) as e:  # cut by a kill mid-write: that work runs again
        log.warning("%s: unreadable progress record (%s): run again", f, e)
    return out

  def add(self, stage: str, index: int, record: dict):
    t0 = time.perf_counter()
    data = gzip.compress(json.dumps(record).encode(), compresslevel=1)
    d = self.dir / stage
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{index}.json.gz").write_bytes(data)
    with self._lock:
      self.done[stage][index] = record
      self.seconds += time.perf_counter() - t0

  def recorder(self, stage: str, index: int, to_record, keep=lambda result: True):
    """A done-callback for a future of unit ``index``: records ``to_record(result)`` when it finished with a
    result ``keep`` accepts (not cancelled, not failed)."""
    def cb(fut):
      if fut.cancelled() or fut.exception() is not None:
        return
      result = fut.result()
      if keep(result):
        try:
          self.add(stage, index, to_record(result))
        except Exception:  # noqa: BLE001 - a record that cannot be written only costs a rerun of that work
          log.exception("%s: could not record %s %d", self.dir, stage, index)
    return cb


def _read_json(f) -> object:
  try:
    return json.loads(f.read_text())
  except (OSError, ValueError):
    return None
