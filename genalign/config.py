"""Typed configuration: dataclass schemas, YAML files and dotted ``key=value`` overrides.

Every component declares its options as a dataclass. A YAML recipe is an instance of such a
schema; command-line overrides use dotted paths (``train.learning_rate=1e-4``). Unknown keys and
values of the wrong type fail at load time with a :class:`ConfigError` that names the key and
lists the allowed ones; a key a schema renamed (its ``renamed_keys``) fails naming the new key.
Cross-field checks live in each schema's ``__post_init__``.

Nothing here mutates its inputs: loading builds new dataclass instances.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

C = TypeVar("C")


class ConfigError(ValueError):
    """A configuration value, key or combination that cannot be used."""


class _Loader(yaml.SafeLoader):
    """YAML with YAML 1.2 booleans: only true/false are booleans.

    YAML 1.1 also reads yes/no/on/off as booleans, so ``train.mixed_precision=no`` reached a
    string option as ``False`` and was rejected (issue 23.6). Here they stay strings; a bool
    option still accepts them (:func:`_convert`).
    """


_BOOL_TAG = "tag:yaml.org,2002:bool"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_WORD_BOOLEANS = {"yes": True, "on": True, "y": True, "no": False, "off": False, "n": False}


def safe_load(text: Any) -> Any:
    """``yaml.safe_load`` with YAML 1.2 booleans (yes/no/on/off stay strings)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert it (YAML ints to floats, lists to tuples...)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in args:
            if option is type(None):
                continue
            try:
                return _convert(value, option, key)
            except ConfigError as error:
                errors.append(str(error))
        if len(errors) == 1:  # ``X | None``: X's own error names the key inside it
            raise ConfigError(errors[0])
        raise ConfigError(f"{key}: {value!r} matches none of {_type_name(tp)}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {list(args)}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping for {tp.__name__}, got {type(value).__name__}")
        return from_dict(tp, value, prefix=key)
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        item_type = args[0] if args else Any
        items = [_convert(v, item_type, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if (origin is tuple or tp is tuple) else items
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        value_type = args[1] if len(args) == 2 else Any
        return {k: _convert(v, value_type, f"{key}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is bool:
        if isinstance(value, str) and value.lower() in _WORD_BOOLEANS:
            return _WORD_BOOLEANS[value.lower()]
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {type(value).__name__} {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {type(value).__name__} {value!r}")
        return value
    return value


def from_dict(schema: type[C], data: Mapping[str, Any], prefix: str = "") -> C:
    """Build ``schema`` from a mapping, rejecting unknown keys and wrong types by name."""
    hints = typing.get_type_hints(schema)
    fields = {f.name: f for f in dataclasses.fields(schema) if f.init}
    # a schema lists its renamed keys as ``renamed_keys = {"old": "new"}`` (a ClassVar)
    for old, new in vars(schema).get("renamed_keys", {}).items():
        if old in data:
            where = f"{prefix}." if prefix else ""
            raise ConfigError(f"config key {where}{old} was renamed: use {where}{new}")
    unknown = [k for k in data if k not in fields]
    if unknown:
        where = f" in {prefix}" if prefix else ""
        raise ConfigError(
            f"unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}{where}; "
            f"allowed keys: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _convert(value, hints[name], key)
    try:
        return schema(**kwargs)
    except TypeError as error:  # a required field is missing
        raise ConfigError(f"{prefix or schema.__name__}: {error}") from error


def to_dict(config: Any) -> dict[str, Any]:
    """A plain, YAML-serialisable dict of a config dataclass."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, Mapping):
            return {k: plain(v) for k, v in value.items()}
        return value

    return plain(config)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b=3"`` -> (["a", "b"], 3); the value is parsed as YAML so numbers and lists work."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    key, _, raw = text.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as error:
        raise ConfigError(
            f"override {text!r}: the value is not valid YAML ({_yaml_problem(error)})"
        ) from error
    return key.split("."), value


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with dotted ``key=value`` overrides applied."""
    import copy

    result = copy.deepcopy(dict(data))
    for text in overrides:
        path, value = parse_override(text)
        node = result
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return result


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    try:
        with path.open(encoding="utf-8") as handle:
            data = safe_load(handle) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: invalid YAML {_yaml_problem(error)}") from error
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def _yaml_problem(error: yaml.YAMLError) -> str:
    """``at line 3, column 7: mapping values are not allowed here`` from a YAML error."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    where = f"at line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}"


def load_config(schema: type[C], path: str | Path | None = None, overrides: Sequence[str] = ()) -> C:
    """Load ``schema`` from an optional YAML file plus dotted overrides."""
    data = load_yaml(path) if path is not None else {}
    return from_dict(schema, apply_overrides(data, overrides))
