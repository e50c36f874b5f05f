"""What changed between the recipe a checkpoint was written by and the one resuming it.

A checkpoint carries its recipe's fingerprint (:meth:`RecipeConfig.fingerprint`) and, since this
module exists, the fingerprinted data itself. When the fingerprints differ, :func:`recipe_changes`
says why: a key the stored recipe does not have is an option a later genalign added (the
checkpoint was written before it existed, so resuming cannot have meant another value for it);
any other difference is a change of the recipe and refuses the resume.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["RecipeChanges", "recipe_changes"]


class RecipeChanges:
    """``added``: dotted keys only the current recipe has; ``changed``: ``(key, stored, current)``
    for keys whose values differ, or that the current recipe no longer has (current ``None``)."""

    def __init__(self) -> None:
        self.added: list[str] = []
        self.changed: list[tuple[str, Any, Any]] = []

    @property
    def compatible(self) -> bool:
        return not self.changed

    def describe(self, limit: int = 5) -> str:
        parts = [f"{key}: {stored!r} -> {current!r}" for key, stored, current in self.changed[:limit]]
        more = len(self.changed) - limit
        return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def recipe_changes(stored: Mapping[str, Any], current: Mapping[str, Any]) -> RecipeChanges:
    """Compare two fingerprinted recipe dicts key by key (nested dicts by their dotted keys)."""
    changes = RecipeChanges()
    _compare(stored, current, "", changes)
    return changes


def _compare(stored: Mapping[str, Any], current: Mapping[str, Any], prefix: str, out: RecipeChanges) -> None:
    for key in sorted(set(stored) | set(current), key=str):
        name = f"{prefix}{key}"
        if key not in stored:
            out.added.append(name)
        elif key not in current:
            out.changed.append((name, stored[key], None))
        elif isinstance(stored[key], Mapping) and isinstance(current[key], Mapping):
            _compare(stored[key], current[key], f"{name}.", out)
        elif stored[key] != current[key]:
            out.changed.append((name, stored[key], current[key]))
