"""toy-dreamsim (genalign/toy/reward_models/similarity.py): the scene edits that make its
judgments, DreamSim's 2AFC hinge loss, the accuracy yardstick, and a short training run."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from genalign.toy.reward_models import similarity as sim
from genalign.toy.scenes import Scene, SceneObject
from genalign.toy.svg_tasks import toy_svg_records

SCENES = [scene for _, _, scene in toy_svg_records(60, seed=3)]


def _objects(scene: Scene) -> Counter:
    return Counter((o.shape, o.colour) for o in scene.objects)


def test_jitter_keeps_the_objects_and_moves_them_a_little():
    rng = np.random.default_rng(0)
    moved = 0
    for scene in SCENES:
        out = sim.jitter(scene, rng, shift=0.05, scale=0.15)
        assert _objects(out) == _objects(scene)
        for a, b in zip(scene.objects, out.objects, strict=True):
            assert abs(a.x - b.x) <= 0.05 + 1e-6 and abs(a.y - b.y) <= 0.05 + 1e-6
            assert b.size <= a.size * 1.15 + 1e-4
            moved += (a.x, a.y) != (b.x, b.y)
        boxes = [o.box for o in out.objects]
        assert all(0 <= v <= 1 for box in boxes for v in box)
    assert moved > len(SCENES)  # not the identity


def test_each_edit_changes_the_object_multiset_by_one_object_or_a_colour_swap():
    rng = np.random.default_rng(1)
    kinds = Counter()
    for scene in SCENES * 3:
        out, kind = sim.edit_scene(scene, rng)
        kinds[kind] += 1
        before, after = _objects(scene), _objects(out)
        assert before != after
        removed, added = before - after, after - before
        if kind in ("colour", "shape"):
            assert sum(removed.values()) == sum(added.values()) == 1 and len(out) == len(scene)
        elif kind == "remove":
            assert sum(removed.values()) == 1 and not added and len(out) == len(scene) - 1
        elif kind == "add":
            assert sum(added.values()) == 1 and not removed and len(out) == len(scene) + 1
        else:  # swap: two objects trade colours, shapes stay
            assert kind == "swap" and sum(removed.values()) == 2 and sum(added.values()) == 2
            assert Counter(o.shape for o in out.objects) == Counter(o.shape for o in scene.objects)
    assert set(kinds) == set(sim.EDITS)


def test_a_single_object_is_never_removed_and_four_objects_never_grow():
    rng = np.random.default_rng(2)
    one = Scene((SceneObject("circle", "red", 0.5, 0.5, 0.3),))
    four = Scene(tuple(SceneObject("square", "blue", x, y, 0.2) for x in (0.25, 0.75) for y in (0.25, 0.75)))
    for _ in range(40):
        assert len(sim.edit_scene(one, rng)[0]) in (1, 2)
        assert len(sim.edit_scene(four, rng)[0]) in (3, 4)


def test_the_far_view_never_holds_the_reference_objects():
    rng = np.random.default_rng(4)
    for scene in SCENES:
        views = sim.triplet_views(scene, rng, 0.05, 0.15)
        assert _objects(views["same"]) == _objects(views["ref"]) == _objects(scene)
        assert _objects(views["edit1"]) != _objects(scene)
        assert _objects(views["edit2"]) != _objects(scene)


def test_hinge_loss_is_dreamsim_eq3_by_hand():
    d_near = torch.tensor([0.10, 0.30, 0.20])
    d_far = torch.tensor([0.40, 0.32, 0.10])
    # margins m - (far - near): 0.05 - 0.30 < 0 -> 0; 0.05 - 0.02 = 0.03; 0.05 + 0.10 = 0.15
    assert sim.hinge_2afc_loss(d_near, d_far, 0.05).item() == pytest.approx((0.03 + 0.15) / 3)
    a, b = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0]])
    assert sim.distance(a, b).item() == pytest.approx(1 - 2**-0.5)


def test_two_afc_accuracy_of_an_encoder_that_counts_the_objects_exactly():
    views = sim.render_views(24, seed=5)
    assert {k: tuple(v.shape) for k, v in views.items()} == {k: (24, 3, 32, 32) for k in sim.VIEWS}

    def constant(images):  # every image the same: every pair a tie
        return torch.ones(len(images), 4)

    assert sim.two_afc_accuracy(constant, views) == {"same_vs_edit1": 0.5, "edit1_vs_edit2": 0.5}
    assert torch.equal(views["ref"][0], sim.render_views(24, seed=5)["ref"][0])  # deterministic


def test_a_short_training_run_lowers_the_loss_and_saves_an_open_clip_folder(tmp_path):
    pytest.importorskip("open_clip")
    recipe = sim.SimilarityRecipe(scenes=48, steps=12, batch_size=16, warmup=2, lr=1e-3, log_every=0)
    views = sim.render_views(48, seed=0)
    embedder, record = sim.train_similarity(recipe, views)
    assert record["steps"] == 12 and record["parameters"] > 0
    assert np.mean(record["losses"][-4:]) < np.mean(record["losses"][:4])
    folder = sim.save_similarity(embedder, recipe, tmp_path / "toy-dreamsim")
    reloaded = sim.load_tower(folder)
    image = views["ref"][:2]
    assert torch.allclose(reloaded.encode_images(image), embedder.encode_images(image), atol=2e-2)
    assert not any(p.requires_grad for p in embedder.model.parameters())
