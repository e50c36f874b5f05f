"""recipe_changes: options added since a checkpoint are told apart from changed ones."""

from genalign.trainers.recipe_diff import recipe_changes


def test_added_keys_are_compatible_and_changed_or_removed_keys_are_not():
    stored = {"train": {"lr": 1e-4, "clip": 0.2}, "model": {"path": "a"}}
    current = {
        "train": {"lr": 1e-4, "clip": 0.2, "token_ppo": {"eps": 0.2}},
        "model": {"path": "a"},
        "new": 1,
    }
    changes = recipe_changes(stored, current)
    assert changes.compatible and changes.added == ["new", "train.token_ppo"] and changes.changed == []

    current["train"]["lr"] = 3e-4
    del current["model"]["path"]
    changes = recipe_changes(stored, current)
    assert not changes.compatible
    assert changes.changed == [("model.path", "a", None), ("train.lr", 1e-4, 3e-4)]
    assert changes.describe() == "model.path: 'a' -> None; train.lr: 0.0001 -> 0.0003"
    assert recipe_changes(stored, current).describe(limit=1).endswith("; and 1 more")


def test_a_value_that_becomes_a_section_is_a_change():
    changes = recipe_changes({"reward": {"kwargs": "x"}}, {"reward": {"kwargs": {"model": "x"}}})
    assert changes.changed == [("reward.kwargs", "x", {"model": "x"})]
