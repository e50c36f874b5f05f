"""Relative paths in a recipe: from the working directory, else from the recipe's own folders.

The shipped recipes name their models relative to the repository (``assets/models/toy-sd``), so
``genalign train configs/toy/demo.yaml`` from the repository's root finds them as written. From
any other working directory the same path is looked up in the recipe's folder and in each folder
above it, and the first that holds it wins: ``genalign train ~/genalign/configs/toy/demo.yaml``
runs from anywhere. Last comes the folder that holds the ``genalign`` package (a clone's root), so
a recipe copied out of the repository still finds the shipped ``assets/models``. A path that exists from the working directory, an absolute path and anything
that is not path-like (a registry name, ``tiny:NAME``, ``hf-hub:...``, a URL) stay as written, and
so does a path found nowhere: a hub id ``organisation/name`` reaches the hub, and a missing
folder's error names the path as the recipe wrote it.

Only what is loaded is resolved (:func:`resolve_recipe_paths` returns a copy): the recipe itself,
its fingerprint included, keeps the paths as written, so a run resumes from any working directory.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

LOCAL_DIR = "local-dir:"  # open_clip's prefix of a local model folder
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the clone (or site-packages) holding genalign


def _path_like(text: str) -> bool:
    if "://" in text or not text:
        return False
    first = text.split("/", 1)[0]
    return ":" not in first and ("/" in text or text.startswith("."))


def resolve_path(value: Any, recipe_dir: str | Path | None) -> Any:
    """``value`` (a string, optionally ``local-dir:``-prefixed) resolved as the module docstring
    says; any other value unchanged."""
    if not isinstance(value, str) or recipe_dir is None:
        return value
    prefix = LOCAL_DIR if value.startswith(LOCAL_DIR) else ""
    rest = value[len(prefix) :]
    if not _path_like(rest) or Path(rest).is_absolute() or Path(rest).exists():
        return value
    folder = Path(recipe_dir).resolve()
    for base in (folder, *folder.parents, PACKAGE_ROOT):
        if (base / rest).exists():
            return prefix + str(base / rest)
    return value


def resolve_nested(value: Any, recipe_dir: str | Path | None) -> Any:
    """:func:`resolve_path` applied to every string inside dicts and lists."""
    if isinstance(value, dict):
        return {key: resolve_nested(item, recipe_dir) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(resolve_nested(item, recipe_dir) for item in value)
    return resolve_path(value, recipe_dir)


def resolve_recipe_paths(config: Any, recipe_dir: str | Path | None) -> Any:
    """A copy of the recipe ``config`` whose model, rewriter, reward and monitor paths are resolved
    against ``recipe_dir`` (the recipe file's folder; None: the copy is unchanged)."""
    loaded = copy.deepcopy(config)
    if recipe_dir is None:
        return loaded
    loaded.model.path = resolve_path(loaded.model.path, recipe_dir)
    if getattr(loaded, "rewriter", None) is not None:
        loaded.rewriter.path = resolve_path(loaded.rewriter.path, recipe_dir)
    loaded.reward.kwargs = resolve_nested(loaded.reward.kwargs, recipe_dir)
    loaded.reward.monitors = resolve_nested(loaded.reward.monitors, recipe_dir)
    return loaded
