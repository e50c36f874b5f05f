"""Typed configs: YAML + dotted overrides, unknown keys and wrong types named at load time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import pytest

from genalign.config import ConfigError, apply_overrides, from_dict, load_config, to_dict
from genalign.registry import Registry, import_object


@dataclass
class Inner:
    rate: float = 0.1
    names: list[str] = field(default_factory=list)
    mode: Literal["a", "b"] = "a"


@dataclass
class Outer:
    steps: int = 3
    inner: Inner = field(default_factory=Inner)
    optional: int | None = None
    flag: bool = False


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("steps: 5\ninner:\n  rate: 2\n  names: [x, y]\n")
    config = load_config(Outer, path, ["inner.mode=b", "optional=7", "flag=true", "inner.rate=1e-3"])
    assert config == Outer(steps=5, inner=Inner(rate=1e-3, names=["x", "y"], mode="b"), optional=7, flag=True)
    assert isinstance(config.inner.rate, float)
    assert to_dict(config)["inner"]["names"] == ["x", "y"]


def test_unknown_key_lists_the_allowed_ones():
    with pytest.raises(
        ConfigError, match=r"unknown config key 'rte' in inner; allowed keys: mode, names, rate"
    ):
        from_dict(Outer, {"inner": {"rte": 1}})


@dataclass
class Renamed:
    renamed_keys: ClassVar[dict[str, str]] = {"lr": "learning_rate"}

    learning_rate: float = 0.1


def test_a_renamed_key_fails_in_one_line_naming_the_new_key():
    with pytest.raises(ConfigError) as error:
        from_dict(Renamed, {"lr": 0.5}, prefix="train")
    assert str(error.value) == "config key train.lr was renamed: use train.learning_rate"
    assert from_dict(Renamed, {"learning_rate": 0.5}).learning_rate == 0.5


@pytest.mark.parametrize(
    "data, message",
    [
        ({"steps": "many"}, "steps: expected an integer"),
        ({"steps": 2.5}, "steps: expected an integer"),
        ({"flag": "maybe"}, "flag: expected true/false"),  # yes/no/on/off are booleans here
        ({"inner": {"mode": "c"}}, r"inner.mode: 'c' is not one of \['a', 'b'\]"),
        ({"inner": {"names": "x"}}, "inner.names: expected a list"),
        ({"inner": 3}, "inner: expected a mapping"),
        ({"inner": {"rate": "fast"}}, "inner.rate: expected a number"),
    ],
)
def test_wrong_types_name_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(Outer, data)


def test_overrides_do_not_mutate_their_input():
    data = {"inner": {"rate": 1.0}}
    assert apply_overrides(data, ["inner.rate=2"])["inner"]["rate"] == 2
    assert data == {"inner": {"rate": 1.0}}
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides(data, ["inner.rate"])


def test_registry_by_name_and_by_import_path():
    registry: Registry[type] = Registry("widget")
    registry.add("inner", Inner)
    assert registry.get("inner") is Inner
    assert registry.get("genalign.config:ConfigError") is ConfigError
    assert import_object("genalign.config:ConfigError") is ConfigError
    with pytest.raises(KeyError, match="unknown widget 'nope'; registered widgets: inner"):
        registry.get("nope")
    with pytest.raises(ImportError, match="no attribute 'Missing'"):
        registry.get("genalign.config:Missing")
