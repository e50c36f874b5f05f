"""The house rules of issue #22 that a reviewer would otherwise count by hand.

* no module in ``genalign/`` over 600 lines;
* no function over 100 lines, except the ``__call__`` of a pipeline (``genalign/pipelines``),
  which mirrors diffusers' one-loop convention;
* the toy models in ``assets/models`` within their 60 MB budget (the repository ships them).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "genalign"
MODELS = PACKAGE.parent / "assets" / "models"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 100
MODELS_BUDGET_BYTES = 60 * 2**20


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def long_files(limit: int = MAX_FILE_LINES) -> list[str]:
    """``path: lines`` of every module over ``limit`` lines."""
    out = []
    for path in _modules():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            out.append(f"{path.relative_to(PACKAGE.parent)}: {lines}")
    return out


def long_functions(limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:line name lines`` of every function over ``limit`` lines, pipeline ``__call__`` s aside."""
    out = []
    for path in _modules():
        in_pipelines = "pipelines" in path.relative_to(PACKAGE).parts
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = node.end_lineno - node.lineno + 1
            if lines > limit and not (in_pipelines and node.name == "__call__"):
                out.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} {lines}")
    return out


def folder_bytes(folder: Path) -> int:
    """Bytes of every file below ``folder`` (what a clone of the repository carries there)."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def test_no_module_over_600_lines():
    assert long_files() == []


def test_no_function_over_100_lines_but_pipeline_calls():
    assert long_functions() == []


def test_the_toy_models_stay_within_their_60_mb_budget():
    used = folder_bytes(MODELS)
    assert used <= MODELS_BUDGET_BYTES, f"assets/models holds {used / 2**20:.1f} MiB, over its 60 MB budget"


def test_the_checks_can_fail():
    # the same scans with tight limits do find offenders, so an empty list above means something
    assert long_files(limit=50)
    assert long_functions(limit=20)
    assert folder_bytes(MODELS) > 2**20  # the models are there to be counted
