"""Recipe paths: from the working directory first, else from the recipe's folder and those above it."""

from __future__ import annotations

from pathlib import Path

from genalign.trainers.config import load_recipe
from genalign.trainers.recipe_paths import resolve_nested, resolve_path, resolve_recipe_paths

ROOT = Path(__file__).resolve().parents[2]


def _tree(tmp_path: Path) -> Path:
    """repo/assets/models/m and repo/configs/toy/ (the recipe's folder); the working dir elsewhere."""
    (tmp_path / "repo" / "assets" / "models" / "m").mkdir(parents=True)
    recipe_dir = tmp_path / "repo" / "configs" / "toy"
    recipe_dir.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    return recipe_dir


def test_a_path_missing_from_the_working_directory_comes_from_the_recipes_ancestors(tmp_path, monkeypatch):
    recipe_dir = _tree(tmp_path)
    monkeypatch.chdir(tmp_path / "elsewhere")
    found = str(tmp_path / "repo" / "assets" / "models" / "m")
    assert resolve_path("assets/models/m", recipe_dir) == found
    assert resolve_path("local-dir:assets/models/m", recipe_dir) == "local-dir:" + found


def test_the_working_directory_wins_and_other_values_stay_as_written(tmp_path, monkeypatch):
    recipe_dir = _tree(tmp_path)
    (tmp_path / "elsewhere" / "assets" / "models" / "m").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert resolve_path("assets/models/m", recipe_dir) == "assets/models/m"  # exists from the cwd
    for value in ("clip", "tiny:qwen2", "hf-hub:org/name", "https://x.org/a/b", "org/name", 3, None):
        assert resolve_path(value, recipe_dir) == value
    assert resolve_path("assets/models/m", None) == "assets/models/m"
    absolute = str(tmp_path / "nowhere")
    assert resolve_path(absolute, recipe_dir) == absolute


def test_nested_kwargs_are_resolved_inside_dicts_and_lists(tmp_path, monkeypatch):
    recipe_dir = _tree(tmp_path)
    monkeypatch.chdir(tmp_path / "elsewhere")
    found = str(tmp_path / "repo" / "assets" / "models" / "m")
    kwargs = {"model": "assets/models/m", "inner": {"paths": ["assets/models/m", "x"]}, "n": 2}
    assert resolve_nested(kwargs, recipe_dir) == {"model": found, "inner": {"paths": [found, "x"]}, "n": 2}


def test_a_shipped_recipe_loads_from_another_directory_and_keeps_its_fingerprint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = ROOT / "configs" / "toy" / "demo.yaml"
    config = load_recipe(recipe)
    loaded = resolve_recipe_paths(config, recipe.parent)
    assert Path(loaded.model.path).is_dir() and Path(loaded.model.path).is_absolute()
    assert Path(loaded.reward.kwargs["model"]).is_dir()
    assert config.model.path == "assets/models/toy-sd-web70"  # the recipe itself keeps what it says
    assert config.fingerprint(["p"]) == load_recipe(recipe).fingerprint(["p"])
