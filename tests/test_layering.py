"""Layering: lower layers never import upper ones (DESIGN.md, "Layers"; STYLE.md: "the toy world and
the tiny-model kit sit on top of the library, not inside it").

Two checks: what importing a subpackage loads in a fresh interpreter, and a static graph of the
module-level imports between subpackages, which must follow :data:`LAYERS` (so it has no cycle).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "genalign"

# Bottom to top. A unit may import units of its own or a lower layer, never of a higher one.
LAYERS: list[set[str]] = [
    {"utils", "registry"},
    {"config"},
    {"sampling", "algorithms"},
    {"policies", "rewards"},
    {"tiny"},  # tiny models for tests and `tiny:` ids, built with the rewards' open_clip registry
    {"trainers", "pipelines"},
    {"toy"},  # the demo drives the trainers
    {"cli", "cli_errors"},  # the command line and its one-line error messages
]
LEVEL = {unit: level for level, units in enumerate(LAYERS) for unit in units}

# what a subpackage must not load when imported on its own
FORBIDDEN_AFTER_IMPORT = {
    "genalign.rewards": ["genalign.toy", "genalign.trainers", "genalign.tiny", "genalign.pipelines"],
    "genalign.sampling": [
        "genalign.policies",
        "genalign.rewards",
        "genalign.trainers",
        "genalign.toy",
        "genalign.pipelines",
        "genalign.algorithms",
    ],
    "genalign.algorithms": [
        "genalign.policies",
        "genalign.rewards",
        "genalign.trainers",
        "genalign.toy",
        "genalign.pipelines",
        "genalign.sampling",
    ],
    "genalign.policies": ["genalign.tiny", "genalign.toy", "genalign.trainers", "genalign.rewards"],
    "genalign.tiny": ["genalign.toy", "genalign.trainers"],
}


def _unit(module: str) -> str | None:
    """The subpackage (or top-level module) of ``genalign.X...``; None outside genalign."""
    parts = module.split(".")
    if parts[0] != "genalign" or len(parts) < 2:
        return None
    return parts[1]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(tree: ast.Module) -> list[str]:
    """Modules imported when the file runs: top-level statements and those in module-level
    ``try`` / ``if`` blocks (except ``if TYPE_CHECKING``), not those inside functions."""
    found: list[str] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            pending += [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            pending += [*node.body, *node.orelse, *node.finalbody]
            for handler in node.handlers:
                pending += handler.body
    return found


def import_graph() -> dict[str, set[str]]:
    """``{unit: units it imports at module level}`` over every file of genalign/."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts == ("__init__.py",):
            continue  # genalign/__init__.py is the package itself, not a layer
        unit = relative.parts[0].removesuffix(".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = {_unit(m) for m in _module_level_imports(tree)} - {None, unit}
        graph.setdefault(unit, set()).update(t for t in targets if t)
    return graph


def test_every_unit_has_a_layer():
    assert set(import_graph()) <= set(LEVEL), (
        f"add the new subpackages to LAYERS: {set(import_graph()) - set(LEVEL)}"
    )


def test_imports_point_down_the_layers():
    upward = sorted(
        f"{unit} -> {target}"
        for unit, targets in import_graph().items()
        for target in targets
        if LEVEL.get(target, -1) > LEVEL[unit]
    )
    assert not upward, f"module-level imports of a higher layer: {upward}"


def test_the_subpackage_graph_is_acyclic():
    graph = import_graph()
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(unit: str, path: list[str]) -> None:
        state[unit] = 1
        for target in sorted(graph.get(unit, ())):
            if state.get(target) == 1:
                raise AssertionError(f"import cycle: {' -> '.join([*path, unit, target])}")
            if state.get(target) is None:
                visit(target, [*path, unit])
        state[unit] = 2

    for unit in sorted(graph):
        if unit not in state:
            visit(unit, [])


def test_the_static_check_sees_an_upward_import(tmp_path):
    tree = ast.parse(
        "import os\nif TYPE_CHECKING:\n    import genalign.toy\ntry:\n    from genalign.toy import x\nexcept ImportError:\n    pass\ndef f():\n    import genalign.trainers\n"
    )
    units = {_unit(m) for m in _module_level_imports(tree)}
    assert "toy" in units and "trainers" not in units


@pytest.mark.parametrize("package", sorted(FORBIDDEN_AFTER_IMPORT))
def test_importing_a_subpackage_loads_no_higher_layer(package):
    forbidden = FORBIDDEN_AFTER_IMPORT[package]
    code = (
        f"import sys, importlib; importlib.import_module({package!r}); "
        f"print(' '.join(sorted(m for m in sys.modules if m in {forbidden!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=PACKAGE.parent,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert not loaded, f"importing {package} loaded {loaded}"


def test_shapes_eval_stays_a_registered_reward():
    code = (
        "import sys; from genalign.rewards import list_rewards, load_reward; "
        "assert 'shapes_eval' in list_rewards(); assert 'genalign.toy' not in sys.modules; "
        "reward = load_reward('shapes_eval'); print(type(reward).__module__)"
    )
    assert _python(code).stdout.strip().splitlines()[-1] == "genalign.toy.shapes_eval"


def test_a_recipe_loads_without_the_model_libraries():
    """``genalign train`` reads the recipe before diffusers / transformers load, so a mistyped key
    fails in seconds; the lazy ``genalign.trainers`` names still resolve."""
    code = (
        "import sys; from genalign.trainers.config import load_recipe; "
        "load_recipe('configs/toy/demo.yaml'); "
        "heavy = [m for m in ('diffusers', 'transformers', 'peft', 'open_clip') if m in sys.modules]; "
        "assert not heavy, heavy; import genalign.trainers as t; "
        "assert callable(t.build_trainer) and 'nft' in t.LOSSES.names() and 'methods' in t.list_trainers(); "
        "missing = [n for n in t.__all__ if getattr(t, n, None) is None]; assert not missing, missing"
    )
    _python(code)


def _python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter from the repository root; it must exit 0."""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=PACKAGE.parent
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result
