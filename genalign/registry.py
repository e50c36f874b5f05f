"""A small named registry shared by policies, rewards, strategies and losses.

Components are registered by name with a decorator, and outside code can be named without any
registration as a ``"package.module:ClassName"`` string (the rsl_rl / open_clip convention). A name
can also stand for such a string (:meth:`Registry.add_lazy`): the module is imported only when the
name is first used, so a lower layer can list a component that lives in an upper one (the
``shapes_eval`` reward of :mod:`genalign.toy`) without importing it.
"""

from __future__ import annotations

import importlib
import inspect
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
        self._lazy: dict[str, str] = {}  # name -> "module.path:Attr", imported on first use

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._entries and self._entries[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered to {self._entries[name]!r}")
            lazy = self._lazy.get(name)
            if lazy is not None and lazy != _import_path(obj):
                raise ValueError(f"{self.kind} {name!r} is already registered to {lazy!r}")
            self._lazy.pop(name, None)
            self._entries[name] = obj
            return obj

        return decorator

    def add(self, name: str, obj: T) -> None:
        self.register(name)(obj)

    def add_lazy(self, name: str, path: str) -> None:
        """Register ``name`` as ``"module.path:Attr"``, imported when :meth:`get` first asks for it.

        The module may itself register the same object under ``name`` when it is imported."""
        module_name, _, attr = path.partition(":")
        if not module_name or not attr:
            raise ValueError(f"expected 'module.path:Name', got {path!r}")
        known = self._lazy.get(name) or (_import_path(self._entries[name]) if name in self._entries else None)
        if known is not None and known != path:
            raise ValueError(f"{self.kind} {name!r} is already registered to {known!r}")
        if name not in self._entries:
            self._lazy[name] = path

    def names(self) -> list[str]:
        return sorted({*self._entries, *self._lazy})

    def __contains__(self, name: str) -> bool:
        return name in self._entries or name in self._lazy

    def get(self, name: str) -> T:
        """Return the entry for ``name`` (importing a lazy one), or import ``"module.path:Attr"``."""
        if name in self._entries:
            return self._entries[name]
        if name in self._lazy:
            obj = import_object(self._lazy[name])
            self._entries[name] = obj  # the module may have registered it already
            self._lazy.pop(name, None)
            return obj
        if ":" in name:
            return import_object(name)
        known = ", ".join(self.names()) or "(none)"
        raise KeyError(f"unknown {self.kind} {name!r}; registered {self.kind}s: {known}")


def _import_path(obj: Any) -> str:
    """``"module.path:QualName"`` of a class or function (what :func:`import_object` imports)."""
    return f"{getattr(obj, '__module__', '')}:{getattr(obj, '__qualname__', '')}"


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


def unknown_option_message(factory: Any, options: Any, what: str) -> str | None:
    """``"{what} takes no option 'x'; its options: ..."`` when ``options`` (names) holds a keyword
    ``factory`` does not take; None when it takes them all, takes ``**kwargs`` or has no signature."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to check against
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    accepted = [n for n, p in parameters.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    unknown = [name for name in options if name not in accepted]
    if not unknown:
        return None
    return (
        f"{what} takes no option {', '.join(map(repr, unknown))}; its options: "
        f"{', '.join(n for n in accepted if n != 'self') or '(none)'}"
    )
