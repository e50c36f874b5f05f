"""A small named registry shared by policies, rewards, strategies and losses.

Components are registered by name with a decorator, and outside code can be named without any
registration as a ``"package.module:ClassName"`` string (the rsl_rl / open_clip convention).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to classes or factories.

    >>> REWARDS = Registry("reward")
    >>> @REWARDS.register("clip")
    ... class ClipReward: ...
    >>> REWARDS.get("clip") is ClipReward
    True
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._entries and self._entries[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered to {self._entries[name]!r}")
            self._entries[name] = obj
            return obj

        return decorator

    def add(self, name: str, obj: T) -> None:
        self.register(name)(obj)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def get(self, name: str) -> T:
        """Return the entry for ``name``, or import ``"module.path:Attr"``."""
        if name in self._entries:
            return self._entries[name]
        if ":" in name:
            return import_object(name)
        known = ", ".join(self.names()) or "(none)"
        raise KeyError(f"unknown {self.kind} {name!r}; registered {self.kind}s: {known}")


def import_object(path: str) -> Any:
    """Import ``"package.module:Attr"`` and return ``Attr``, with a clear error on failure."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"expected 'module.path:Name', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(f"cannot import module {module_name!r} named in {path!r}: {error}") from error
    try:
        return getattr(module, attr)
    except AttributeError as error:
        raise ImportError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})") from error
