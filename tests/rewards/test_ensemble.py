"""Weighted, normalised ensembles of rewards."""

from __future__ import annotations

import pytest
import torch

from genalign.rewards import EnsembleReward, Reward, RewardOutput, load_reward

from .helpers import PROMPTS, uint8_images


@pytest.fixture
def members(tiny_hf_clip, tiny_open_clip, hps_checkpoints):
    clip_kwargs = {"backend": "transformers", "model": str(tiny_hf_clip.folder), "convention": "cosine"}
    hps_kwargs = {"checkpoint": str(hps_checkpoints["official"]), "model": tiny_open_clip.name}
    return clip_kwargs, hps_kwargs


def test_weighted_sum_from_specs(members):
    clip_kwargs, hps_kwargs = members
    images = uint8_images(4, 32, 32, seed=11)
    clip = load_reward("clip", **clip_kwargs)(images, PROMPTS).scores
    hps = load_reward("hpsv2", **hps_kwargs)(images, PROMPTS).scores
    jpeg = load_reward("jpeg_incompressibility")(images, PROMPTS).scores
    ensemble = load_reward(
        "ensemble",
        members=[
            {"name": "clip", "weight": 2.0, "kwargs": clip_kwargs},
            {"name": "hpsv2", "weight": -0.5, "kwargs": hps_kwargs, "normalize": "batch"},
            {"name": "jpeg_incompressibility", "weight": 0.1, "normalize": {"mean": 3.0, "std": 2.0}},
        ],
    )
    out = ensemble(images, PROMPTS)
    hps_z = (hps - hps.mean()) / (hps.std(unbiased=False) + 1e-6)
    expected = 2.0 * clip - 0.5 * hps_z + 0.1 * (jpeg - 3.0) / 2.0
    torch.testing.assert_close(out.scores, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.details["clip"], clip, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.details["hpsv2"], hps, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.details["hpsv2/normalized"], hps_z, atol=1e-5, rtol=0)
    assert "jpeg_incompressibility/jpeg_kb" in out.details
    assert not ensemble.differentiable  # the JPEG member is not


def test_differentiable_ensemble_of_instances_with_repeated_names(members):
    clip_kwargs, hps_kwargs = members
    first, second = load_reward("clip", **clip_kwargs), load_reward("hpsv2", **hps_kwargs)
    third = load_reward("clip", **clip_kwargs)
    ensemble = load_reward(
        "ensemble", members=[first, {"reward": second, "weight": 0.5}, {"reward": third, "key": "c2"}]
    )
    assert ensemble.differentiable and ensemble.keys == ["clip", "hpsv2", "c2"]
    images = uint8_images(2, 32, 32, seed=12).requires_grad_(True)
    out = ensemble(images, PROMPTS[:2])
    torch.testing.assert_close(
        out.scores, 2 * out.details["clip"] + 0.5 * out.details["hpsv2"], atol=1e-6, rtol=0
    )
    (grad,) = torch.autograd.grad(out.scores.sum(), images)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    repeated = load_reward("ensemble", members=[first, third])
    assert repeated.keys == ["clip", "clip_1"]


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"name": "jpeg_compressibility", "wieght": 1.0}, "wieght"),
        ({"weight": 1.0}, "exactly one of"),
        ({"name": "jpeg_compressibility", "normalize": "zscore"}, "normalize"),
        ({"name": "jpeg_compressibility", "normalize": {"mean": 0.0, "std": 0.0}}, "std"),
    ],
)
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(ValueError, match=message):
        load_reward("ensemble", members=[spec])


def test_unknown_member_name_lists_rewards():
    with pytest.raises(KeyError, match="registered rewards: .*pickscore"):
        load_reward("ensemble", members=[{"name": "imagereward9000"}])


class Constant(Reward):
    """Scores given at construction (one member's head returned NaN for one image, say)."""

    name = "constant_scores_test"

    def __init__(self, scores: list[float]) -> None:
        super().__init__()
        self.values = torch.tensor(scores)

    def score(self, images, prompts, **metadata):
        return RewardOutput(self.values.clone(), {})


def test_batch_normalisation_keeps_a_nan_to_its_own_sample():
    images = torch.rand(4, 3, 8, 8)
    first = [1.0, float("nan"), 2.0, 3.0]
    ensemble = EnsembleReward(
        [
            {"reward": Constant(first), "normalize": "batch", "key": "a"},
            {"reward": Constant([0.5] * 4), "key": "b"},
        ]
    )
    out = ensemble(images, ["p"] * 4)
    assert out.details["nan_count"] == 1 and torch.isnan(out.scores[1])
    finite = torch.tensor([1.0, 2.0, 3.0])  # statistics over the finite scores only
    z = (finite - finite.mean()) / (finite.std(unbiased=False) + 1e-6)  # BATCH_EPS
    torch.testing.assert_close(out.scores[[0, 2, 3]], z + 0.5, atol=1e-6, rtol=0)
