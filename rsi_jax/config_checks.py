"""The config modules' shared checks: :class:`ConfigError` and the value checks each section's ``validate`` uses.

Imported by the schema modules (:mod:`rsi_jax.config_schema`, :mod:`rsi_jax.config_learning`) and the loader
(:mod:`rsi_jax.config_loader`); it imports none of them.
"""

from __future__ import annotations

import re


class ConfigError(ValueError):
  """A configuration value is unknown, of the wrong type, or impossible. The message names the key."""


_STORES = ("gs", "s3", "gcs", "hdfs", "az", "abfs", "file")  # object-store schemes a location may use


def check_location(value: str, key: str):
  """A folder or an object-store URL; a URL with a typo in its scheme (``gs:/b``, ``gs//b``, ``gs:b``) is an
  error rather than a local folder named ``gs:`` or ``gs`` in the current directory."""
  m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)(:/*|//)", value)
  if m and m.group(1).lower() in _STORES and not value.startswith(f"{m.group(1)}://"):
    raise ConfigError(f"{key}: {value!r} looks like a {m.group(1)}:// URL with a typo (write "
                      f"{m.group(1)}://bucket/path)")


def check(ok: bool, key: str, msg: str):
  """Raise :class:`ConfigError` ``key: msg`` unless ``ok``."""
  if not ok:
    raise ConfigError(f"{key}: {msg}")
