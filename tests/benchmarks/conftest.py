"""Shared fixtures of the benchmark tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="session")
def benchmark_module():
    """``load(name)``: ``benchmarks/<name>.py`` as a module (the folder holds scripts, not a package;
    its own folder goes on ``sys.path`` for the scripts that import a sibling)."""

    def load(name: str) -> ModuleType:
        if str(BENCHMARKS) not in sys.path:
            sys.path.insert(0, str(BENCHMARKS))
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it, as an import does (dataclasses look it up)
        spec.loader.exec_module(module)
        return module

    return load
