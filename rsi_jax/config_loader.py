"""Loading the configuration: YAML run file chains, model files, phase overlays and key=value overrides.

A run file names its base with ``base_config:`` and its model with ``model_name:`` (``configs/models/<name>.yml``
into the ``model`` section); command-line ``key=value`` overrides come last. The merged tree is coerced into the
schema's types (:mod:`rsi_jax.config_schema`) and validated; what the user's own files and command line set is
recorded (:meth:`~rsi_jax.config_schema.Config.user_keys`) so that the shipped phase files fill in only the rest.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from rsi_jax.config_checks import ConfigError
from rsi_jax.config_schema import Config

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"


_META_KEYS = ("base_config", "model_name")


def load_config(path: str | os.PathLike | None = None, overrides: Sequence[str] = ()) -> Config:
  """Load a YAML run file (with ``base_config`` inheritance) and apply ``key=value`` overrides."""
  tree: dict = {}
  user: dict = {}  # what the user's files say: the chain without the shipped configs/base.yml
  if path is not None:
    tree = _load_yaml_chain(Path(path))
    user = _load_yaml_chain(Path(path), shipped_base=False)
  ov = parse_overrides(overrides)
  # model_name may itself be overridden on the command line.
  model_name = tree.pop("model_name", None)
  if "model_name" in ov:
    model_name = ov.pop("model_name").raw
  tree.pop("base_config", None)
  if model_name is not None:
    model_tree = load_model_file(str(model_name))
    tree["model"] = _deep_merge(model_tree, tree.get("model", {}) or {})
  tree = _deep_merge(tree, _nest(ov))
  user = {k: v for k, v in user.items() if k not in _META_KEYS}
  return _with_user_keys(build_config(tree), _leaf_keys(_deep_merge(user, _nest(ov))))


def load_cli_config(path: str, overrides: Sequence[str]) -> Config:
  """For entry points: the config, or a one-line error naming the key on stderr and exit status 2."""
  try:
    return load_config(path, overrides)
  except ConfigError as e:
    print(f"config error: {e}", file=sys.stderr)
    raise SystemExit(2) from None


def load_model_file(name: str) -> dict:
  f = CONFIG_DIR / "models" / f"{name}.yml"
  if not f.exists():
    known = sorted(x.stem for x in (CONFIG_DIR / "models").glob("*.yml"))
    raise ConfigError(f"model_name: no model file {f} (known: {known})")
  data = _read_yaml(f)
  data.setdefault("name", name)
  return data


def load_phase_overlay(phase: str, under: Config | None = None, cli: Sequence[str] = ()) -> dict:
  """The overlay ``configs/phases/<phase>.yml`` (a nested dict of section overrides), {} if absent. With
  ``under``, less every key the user set for that config (:meth:`Config.user_keys`) or ``cli`` sets: what a
  user wrote wins over the shipped phase files."""
  f = CONFIG_DIR / "phases" / f"{phase}.yml"
  overlay = _read_yaml(f) if f.exists() else {}
  if under is None and not cli:
    return overlay
  keys = (under.user_keys() if under is not None else frozenset()) | _leaf_keys(_nest(parse_overrides(cli)))
  return _without(overlay, keys)


def build_config(tree: Mapping[str, Any]) -> Config:
  """Typed, validated Config from a nested dict. Unknown keys and wrong types raise ConfigError.

  Missing keys take the defaults of ``Config()`` (so a partial ``critic_optim`` keeps the critic's own
  learning rate and clip, not ``OptimConfig``'s)."""
  cfg = _build(Config, _deep_merge(Config().to_dict(), tree), "")
  cfg.validate()
  return _with_user_keys(cfg, _leaf_keys(tree))


def with_overrides(cfg: Config, overrides: Mapping[str, Any] | Sequence[str]) -> Config:
  """A new validated Config with nested-dict or ``key=value`` overrides applied."""
  if not isinstance(overrides, Mapping):
    overrides = _nest(parse_overrides(overrides))
  return _with_user_keys(build_config(_deep_merge(cfg.to_dict(), dict(overrides))),
                         cfg.user_keys() | _leaf_keys(overrides))


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
  """``["a.b=1", "name=x"]`` -> ``{"a.b": 1, "name": "x"}`` (values parsed as YAML, raw text kept)."""
  out: dict[str, Any] = {}
  for item in overrides:
    if "=" not in item:
      raise ConfigError(f"override {item!r}: expected key=value")
    key, raw = item.split("=", 1)
    key = key.strip().lstrip("-")
    if not key:
      raise ConfigError(f"override {item!r}: empty key")
    try:
      value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
      value = raw
    # Keep the raw text so str fields receive exactly what was typed (e.g. name=007).
    out[key] = _RawValue(value, raw)
  return out


class _RawValue:
  """A YAML-parsed override value that remembers the text it came from."""

  __slots__ = ("value", "raw")

  def __init__(self, value, raw):
    self.value, self.raw = value, raw

  def __repr__(self):
    return repr(self.value)


def _read_yaml(f: Path) -> dict:
  try:
    data = yaml.safe_load(f.read_text()) or {}
  except yaml.YAMLError as e:
    raise ConfigError(f"{f}: invalid YAML: {e}") from None
  except OSError as e:
    raise ConfigError(f"{f}: cannot read: {e}") from None
  if not isinstance(data, dict):
    raise ConfigError(f"{f}: top level must be a mapping, got {type(data).__name__}")
  return data


def _load_yaml_chain(path: Path, seen: tuple = (), shipped_base: bool = True) -> dict:
  """A run file merged over the files its ``base_config`` names; without ``shipped_base``, configs/base.yml
  (the shipped defaults) left out of the chain: what the user's own files say."""
  if not path.exists():
    alt = CONFIG_DIR / path
    if alt.exists():
      path = alt
    else:
      raise ConfigError(f"config file {path} does not exist")
  path = path.resolve()
  if path in seen:
    raise ConfigError(f"base_config: cycle through {path}")
  if not shipped_base and path == (CONFIG_DIR / "base.yml").resolve():
    return {}
  data = _read_yaml(path)
  if not data:  # an empty run file would start a default run of every task without a word
    raise ConfigError(f"config file {path} is empty (start from configs/smoke.yml or configs/base.yml)")
  base = data.pop("base_config", None)
  if base is None:
    return data
  base_path = (path.parent / base) if not os.path.isabs(base) else Path(base)
  parent = _load_yaml_chain(base_path, seen + (path,), shipped_base)
  # The child's model_name wins over the parent's.
  return _deep_merge(parent, data)


def _leaf_keys(tree: Mapping, prefix: str = "") -> frozenset:
  """The dotted keys of a nested dict's values (an empty dict is a value, so is a command-line value)."""
  out = set()
  for k, v in tree.items():
    if isinstance(v, Mapping) and v:
      out |= _leaf_keys(v, f"{prefix}{k}.")
    else:
      out.add(f"{prefix}{k}")
  return frozenset(out)


def _without(tree: Mapping, keys: frozenset, prefix: str = "") -> dict:
  """``tree`` less every value at, inside or around a dotted key of ``keys`` (a dict the user set whole, or a
  value of which the user set a part, goes entirely; sections the user set other keys of stay)."""
  out = {}
  for k, v in tree.items():
    key = f"{prefix}{k}"
    if key in keys or any(key.startswith(u + ".") for u in keys):
      continue
    if isinstance(v, Mapping) and v:
      rest = _without(v, keys, key + ".")
      if rest:
        out[k] = rest
    elif not any(u.startswith(key + ".") for u in keys):
      out[k] = v
  return out


def _with_user_keys(cfg: Config, keys) -> Config:
  object.__setattr__(cfg, "_user_keys", frozenset(keys))  # not a field: to_dict / dump_config never see it
  return cfg


def _nest(flat: Mapping[str, Any]) -> dict:
  out: dict = {}
  for key, v in flat.items():
    parts = key.split(".")
    d = out
    for part in parts[:-1]:
      d = d.setdefault(part, {})
      if not isinstance(d, dict):
        raise ConfigError(f"{key}: {part} is not a section")
    d[parts[-1]] = v
  return out


def _deep_merge(a: Mapping, b: Mapping) -> dict:
  out = dict(a)
  for k, v in b.items():
    if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
      out[k] = _deep_merge(out[k], v)
    else:
      out[k] = v
  return out


def _build(cls, tree, prefix: str):
  if isinstance(tree, _RawValue):
    tree = tree.value
  if not isinstance(tree, Mapping):
    raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(tree).__name__}")
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = [k for k in tree if k not in fields and not (prefix == "" and k in _META_KEYS)]
  if unknown:
    raise ConfigError(f"{prefix + '.' if prefix else ''}{unknown[0]}: unknown config key "
                      f"(known in {prefix or 'the top level'}: {sorted(fields)})")
  hints = typing.get_type_hints(cls)
  kwargs = {}
  for name in fields:
    if name not in tree:
      continue
    key = f"{prefix}.{name}" if prefix else name
    typ = hints[name]
    kwargs[name] = _build(typ, tree[name], key) if dataclasses.is_dataclass(typ) else _coerce(
        tree[name], typ, key)
  return cls(**kwargs)


def _coerce(value, typ, key):
  raw = None
  if isinstance(value, _RawValue):
    value, raw = value.value, value.raw
  origin = typing.get_origin(typ)
  if origin in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(typ) if a is not type(None)]
    if value is None:
      return None
    return _coerce(_RawValue(value, raw), args[0], key)
  if typ is bool:
    if isinstance(value, bool):
      return value
    raise ConfigError(f"{key}: expected true/false, got {value!r}")
  if typ is int:
    if isinstance(value, int) and not isinstance(value, bool):
      return value
    if isinstance(value, float) and value.is_integer():
      return int(value)
    raise ConfigError(f"{key}: expected an integer, got {value!r}")
  if typ is float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return float(value)
    if isinstance(value, str):
      try:
        return float(value)  # YAML 1.1 reads "1e-7" as a string
      except ValueError:
        pass
    raise ConfigError(f"{key}: expected a number, got {value!r}")
  if typ is str:
    if raw is not None:  # the text as typed, unless quoted as a YAML string (name='' is empty, not two quotes)
      quoted = len(raw.strip()) >= 2 and raw.strip()[0] == raw.strip()[-1] and raw.strip()[0] in "'\""
      return value if quoted and isinstance(value, str) else raw
    if isinstance(value, str):
      return value
    raise ConfigError(f"{key}: expected a string, got {value!r}")
  if typ is tuple or origin is tuple:
    if isinstance(value, str) and raw is not None:
      value = [x for x in value.split(",") if x] if "," in value else [value]
    if not isinstance(value, (list, tuple)):
      raise ConfigError(f"{key}: expected a list, got {value!r}")
    return tuple(_freeze(v) for v in value)
  if typ is dict or origin is dict:
    if not isinstance(value, Mapping):
      raise ConfigError(f"{key}: expected a mapping, got {value!r}")
    return types.MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
  raise ConfigError(f"{key}: unsupported type {typ}")


def _freeze(v):
  if isinstance(v, _RawValue):  # a dict entry given on the command line (pipeline.actor_from.rpr1=init)
    return v.raw if isinstance(v.value, str) else _freeze(v.value)
  if isinstance(v, list):
    return tuple(_freeze(x) for x in v)
  if isinstance(v, dict):
    return types.MappingProxyType({k: _freeze(x) for k, x in v.items()})
  return v


def dump_config(cfg: Config) -> str:
  return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
