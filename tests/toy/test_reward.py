"""The ``shapes_eval`` reward: registry, specs from metadata or parsed captions, partial credit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import genalign.toy  # noqa: F401  (registers "shapes_eval")
from genalign.rewards.base import list_rewards, load_reward
from genalign.toy.captions import CATEGORIES
from genalign.toy.prompts import sample_scene_for_prompt
from genalign.toy.scenes import Scene, SceneObject, render_scene, render_scenes
from genalign.toy.shapes_eval import ShapesEvalReward


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(11)
    samples = [sample_scene_for_prompt(category, rng) for category in CATEGORIES for _ in range(2)]
    scenes, captions, specs = zip(*samples)
    return render_scenes(scenes, 64), list(captions), list(specs)


def test_registered():
    assert "shapes_eval" in list_rewards()
    assert isinstance(load_reward("shapes_eval"), ShapesEvalReward)
    assert isinstance(load_reward("genalign.toy.shapes_eval:ShapesEvalReward"), ShapesEvalReward)
    assert not load_reward("shapes_eval").differentiable


def test_scores_correct_images_one(batch):
    images, captions, specs = batch
    reward = load_reward("shapes_eval")
    from_specs = reward(images, captions, specs=specs)
    from_captions = reward(images, captions)
    torch.testing.assert_close(from_specs.scores, torch.ones(len(captions)))
    torch.testing.assert_close(from_captions.scores, from_specs.scores)
    details = from_specs.details
    assert details["category"] == [s["tag"] for s in specs]
    assert details["unparsed_count"] == 0 and details["nan_count"] == 0
    first = details["objects"][0][0]
    assert set(first) == {"shape", "colour", "box", "area", "rgb", "features"}


def test_wrong_prompts_score_zero(batch):
    images, captions, _ = batch
    # every prompt paired with an image drawn for another category's prompt
    shifted = captions[2:] + captions[:2]
    scores = load_reward("shapes_eval")(images, shifted).scores
    assert scores.mean() < 0.3


def test_partial_credit():
    scene = Scene(
        (SceneObject("circle", "red", 0.25, 0.5, 0.3), SceneObject("square", "green", 0.75, 0.5, 0.3))
    )
    image = render_scene(scene)[None]
    prompt = ["a red circle and a blue square"]  # 4 checks: circle, red, square, blue
    assert load_reward("shapes_eval")(image, prompt).scores.item() == 0.0
    out = load_reward("shapes_eval", partial=True)(image, prompt)
    assert out.scores.item() == pytest.approx(0.75)
    assert out.details["correct"].item() == 0.0
    assert out.details["reasons"][0] == ["expected blue square>=1, found colours: green"]


def test_prompts_outside_the_grammar_get_the_penalty(batch):
    images, captions, _ = batch
    out = load_reward("shapes_eval")(images[:2], ["a photo of a cat", captions[1]])
    assert out.scores.tolist() == [0.0, 1.0]
    assert out.details["unparsed_count"] == 1


def test_spec_count_must_match(batch):
    images, captions, specs = batch
    with pytest.raises(ValueError, match="specs"):
        load_reward("shapes_eval")(images, captions, specs=specs[:1])
