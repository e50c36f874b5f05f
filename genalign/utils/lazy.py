"""Package attributes imported on first use (PEP 562), so importing a package loads no heavy library.

``__getattr__, __dir__ = lazy_exports(__name__, {"Name": "submodule", ...})`` in a package's
``__init__`` makes ``package.Name`` import ``package.submodule`` the first time it is read, and
keeps it as an ordinary attribute afterwards.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` whose ``exports`` map each exported name to
    the submodule (relative to ``package``) that defines it."""
    module = sys.modules[package]

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(module), *exports})

    return __getattr__, __dir__
