"""PickScore (Kirstain et al. 2023): logit_scale.exp() * cosine, and softmax over a prompt's images."""

from __future__ import annotations

import pytest
import torch

from genalign.rewards import load_reward

from .helpers import PROMPTS, transformers_cosine, uint8_images


@pytest.fixture
def native_images():
    return uint8_images(4, 32, 32, seed=7)


@pytest.fixture
def pickscore_folder(tiny_hf_clip):
    """PickScore_v1's layout: a CLIPModel folder; the processor folder given separately."""
    return str(tiny_hf_clip.folder)


def test_raw_score_formula(tiny_hf_clip, pickscore_folder, native_images):
    reward = load_reward("pickscore", model=pickscore_folder, processor=pickscore_folder)
    expected = tiny_hf_clip.model.logit_scale.exp() * transformers_cosine(
        tiny_hf_clip, native_images, PROMPTS
    )
    out = reward(native_images, PROMPTS)
    torch.testing.assert_close(out.scores, expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(out.details["pickscore"], out.scores.detach())


def test_softmax_groups_identical_prompts(pickscore_folder, native_images):
    raw = load_reward("pickscore", model=pickscore_folder, processor=pickscore_folder)(
        native_images, PROMPTS
    ).scores
    reward = load_reward("pickscore", model=pickscore_folder, processor=pickscore_folder, softmax=True)
    probs = reward(native_images, PROMPTS).scores
    # PROMPTS[0] == PROMPTS[2]: one group of two; the other two images are alone (probability 1)
    pair = torch.softmax(raw[[0, 2]], dim=0)
    torch.testing.assert_close(probs[[0, 2]], pair)
    torch.testing.assert_close(probs[[1, 3]], torch.ones(2))


def test_softmax_groups_by_group_ids(pickscore_folder, native_images):
    raw = load_reward("pickscore", model=pickscore_folder, processor=pickscore_folder)(
        native_images, PROMPTS
    ).scores
    reward = load_reward("pickscore", model=pickscore_folder, processor=pickscore_folder, softmax=True)
    probs = reward(native_images, PROMPTS, group_ids=torch.tensor([0, 0, 1, 1])).scores
    torch.testing.assert_close(probs[:2], torch.softmax(raw[:2], 0))
    torch.testing.assert_close(probs[2:], torch.softmax(raw[2:], 0))
    with pytest.raises(ValueError, match="group_ids"):
        reward(native_images, PROMPTS, group_ids=[0, 1])
