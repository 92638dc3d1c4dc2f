"""Configuration: frozen dataclasses filled from YAML files and `--set a.b=c` overrides.

Every command has one root dataclass. `resolve(root, yaml_path, sets)` starts from the root's
defaults and applies the YAML file with every `--set` over it (later ones win), all at once: each
section is built, and checked, once with all of its new values, so settings that must agree are
checked together whatever their order. Unknown keys are errors that name the closest valid key;
values are coerced to the field's declared type, so a typo never passes silently.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from shards.storage import as_path, check_reachable, is_url

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration file or override that does not fit the config dataclasses."""


def parse_sets(sets: list[str]) -> list[tuple[list[str], Any]]:
    """Parse `a.b=c` strings into (path, value); values are read as YAML scalars or lists."""
    parsed = []
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        parsed.append((key.strip().split("."), yaml.safe_load(text) if text else ""))
    return parsed


def load_yaml(path: str | Path) -> dict:
    path = as_path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def resolve(root: T, yaml_path: str | Path | None = None, sets: list[str] | None = None) -> T:
    """The dataclass instance `root` with a YAML file and `--set` overrides applied: the sets
    written over the file's mapping in order, then merged at once (module docstring)."""
    values = load_yaml(yaml_path) if yaml_path is not None else {}
    for path, value in parse_sets(sets or []):
        values = _with(values, path, value)
    return merge(root, values) if values else root


def _with(values: dict, path: list[str], value: Any) -> dict:
    """A copy of the nested mapping `values` with `value` at `path` (a mapping that was not a
    mapping there becomes one)."""
    head, *rest = path
    inner = values.get(head)
    return {**values, head: _with(inner if isinstance(inner, dict) else {}, rest, value)
            if rest else value}


def merge(config: T, values: dict, prefix: str = "") -> T:
    """A copy of `config` with the nested mapping `values` applied field by field."""
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix or 'config'} must be a mapping, got {values!r}")
    changes = {}
    for key, value in values.items():
        path = f"{prefix}{key}"
        field_type = _field_type(config, key, path)
        current = getattr(config, key)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            changes[key] = merge(current, value, prefix=f"{path}.")
        else:
            changes[key] = _coerce(value, field_type, path)
    # One replace per section: its checks see all of the new values together.
    try:
        return dataclasses.replace(config, **changes)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        # A section's own check names its field ("depth = 19: ..."): say where it sits.
        if prefix and re.match(r"\w+ = ", str(err)):
            raise ConfigError(f"{prefix}{err}") from err
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {err}") from err


def set_path(config: T, path: list[str], value: Any) -> T:
    """A copy of `config` with the field at dotted `path` set to `value`."""
    nested: Any = value
    for key in reversed(path):
        nested = {key: nested}
    return merge(config, nested)


def absolute_paths(config: T, fields: Sequence[str]) -> T:
    """A copy of `config` whose dotted `fields` (each a path or a tuple of paths; "" is unset) are
    absolute, read against this process's working directory: Ray workers run in another one.
    URLs (s3://...) are kept as they are; an object store that cannot be used is StorageError
    naming the URL, in seconds (check_reachable). ConfigError names the first path that does not
    exist."""
    for name in fields:
        value: Any = config
        for key in name.split("."):
            value = getattr(value, key)
        paths = [value] if isinstance(value, str) else list(value)
        for path in paths:
            if is_url(path):
                # Here a URL from a config file or --set first meets its store: botocore's own
                # error names no URL, and retries a dead endpoint for a minute.
                check_reachable(path)
            if path and not as_path(path).exists():
                where = "" if os.path.isabs(path) or is_url(path) else f" (looked in {os.getcwd()})"
                raise ConfigError(f"{name}: {path} does not exist{where}")
        paths = [os.path.abspath(path) if path and not is_url(path) else path for path in paths]
        config = set_path(config, name.split("."), paths[0] if isinstance(value, str) else paths)
    return config


def check_positive(config: Any, section: str, *names: str, allow_zero: bool = False) -> None:
    """ConfigError naming the first field of `names` (of `config`, the tree's `section`) that is
    not > 0 (with `allow_zero`: not >= 0), e.g. "optim.lr = -1.0: must be positive"; None passes."""
    for name in names:
        value = getattr(config, name)
        if value is not None and (value < 0 if allow_zero else value <= 0):
            rule = "must be >= 0" if allow_zero else "must be positive"
            raise ConfigError(f"{section}.{name} = {value}: {rule}")


def to_dict(config: Any) -> dict:
    """Plain nested dict (tuples as lists), for YAML/JSON dumps of the resolved config."""
    return plain(dataclasses.asdict(config))


def plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _field_type(config: Any, key: str, path: str) -> Any:
    names = [f.name for f in dataclasses.fields(config)]
    if key not in names:
        parent = path.rpartition(".")[0]
        valid = [f"{parent}.{n}" if parent else n for n in names]
        close = difflib.get_close_matches(path, valid, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(valid)}"
        raise ConfigError(f"unknown config key {path!r}{hint}")
    return typing.get_type_hints(type(config))[key]


def _coerce(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, path)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0])
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path} must be one of {list(args)}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            value = [value]
        inner = args[0] if args and (len(args) == 2 and args[1] is Ellipsis) else None
        if inner is None and args and len(args) != len(value):
            raise ConfigError(f"{path} needs {len(args)} values, got {len(value)}")
        types_ = [inner] * len(value) if inner is not None else list(args)
        return tuple(_coerce(v, t, f"{path}[{i}]") for i, (v, t) in enumerate(zip(value, types_)))
    if dataclasses.is_dataclass(tp):
        raise ConfigError(f"{path} is a section; set its fields, e.g. {path}.<field>=...")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{path} must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{path} must be a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{path} must be a string, got {value!r}")
    return value
