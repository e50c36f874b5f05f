"""Lazy registry entries: a name that stands for a "module:Attr" string until first used."""

from __future__ import annotations

import sys

import pytest

from genalign.registry import Registry


def test_a_lazy_entry_is_listed_and_imported_on_first_use():
    registry = Registry("thing")
    registry.add_lazy("ordered", "collections:OrderedDict")
    assert "ordered" in registry and registry.names() == ["ordered"]
    import collections

    assert registry.get("ordered") is collections.OrderedDict
    assert registry.get("ordered") is collections.OrderedDict  # cached


def test_a_lazy_entry_does_not_import_its_module_until_asked(tmp_path, monkeypatch):
    (tmp_path / "lazy_registry_probe.py").write_text("class Thing:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry("thing")
    registry.add_lazy("probe", "lazy_registry_probe:Thing")
    assert "lazy_registry_probe" not in sys.modules
    assert registry.get("probe").__name__ == "Thing"
    assert "lazy_registry_probe" in sys.modules
    del sys.modules["lazy_registry_probe"]


def test_the_module_may_register_the_same_object_under_the_lazy_name():
    registry = Registry("thing")
    registry.add_lazy("thing", f"{__name__}:_Registered")
    registry.register("thing")(_Registered)  # what the module's decorator does on import
    assert registry.get("thing") is _Registered


def test_conflicting_entries_are_refused():
    registry = Registry("thing")
    registry.add_lazy("thing", f"{__name__}:_Registered")
    with pytest.raises(ValueError, match="already registered"):
        registry.add_lazy("thing", "collections:OrderedDict")
    with pytest.raises(ValueError, match="already registered"):
        registry.register("thing")(_Other)
    with pytest.raises(ValueError, match="module.path:Name"):
        registry.add_lazy("bad", "no_colon")


class _Registered:
    pass


class _Other:
    pass
