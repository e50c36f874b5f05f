"""``clip_iqa`` (CLIP-IQA, Wang et al. 2023) against a hand computation on tiny CLIP models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from genalign.rewards import load_reward
from genalign.rewards.iqa import CLIP_IQA_ENSEMBLE_PAIRS, CLIPIQAReward
from genalign.tiny.clip import OPEN_CLIP_WEIGHTS_NAME, TINY_OPEN_CLIP_NAME, clip_model, open_clip_model

from . import to_pil, uint8_images


@pytest.fixture(scope="module")
def tiny_hf_clip(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clip_iqa_hf")
    model, processor = clip_model(seed=0, save_to=folder)
    return folder, model, processor


@pytest.fixture(scope="module")
def tiny_open_clip(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clip_iqa_open_clip")
    model, preprocess, tokenizer, config = open_clip_model(seed=1, save_to=folder)
    return folder, model, preprocess, tokenizer, config


@pytest.fixture
def images():
    """32x32: the tiny models' resolution, so preprocessing is normalisation only."""
    return uint8_images(4, 32, 32, seed=3)


def pair_probabilities(image_features, text_features, scale) -> torch.Tensor:
    """softmax(scale * cos) over each (positive, negative) pair -> P(positive), [B, P]."""
    cos = F.normalize(image_features, dim=-1) @ F.normalize(text_features, dim=-1).T  # (B, 2P)
    logits = scale * cos
    return torch.stack(
        [
            torch.softmax(logits[:, 2 * k : 2 * k + 2], dim=-1)[:, 0]
            for k in range(text_features.shape[0] // 2)
        ],
        dim=-1,
    )


def test_transformers_clip_iqa_equals_hand_computation(tiny_hf_clip, images):
    folder, model, processor = tiny_hf_clip
    reward = CLIPIQAReward(backend="transformers", model=str(folder))
    out = reward(images, None)
    with torch.no_grad():
        pixels = processor(images=[to_pil(image) for image in images], return_tensors="pt")["pixel_values"]
        image_features = model.get_image_features(pixel_values=pixels)
        image_features = image_features if torch.is_tensor(image_features) else image_features.pooler_output
        tokens = processor.tokenizer(["Good photo.", "Bad photo."], padding=True, return_tensors="pt")
        text_features = model.get_text_features(**tokens)
        text_features = text_features if torch.is_tensor(text_features) else text_features.pooler_output
    expected = pair_probabilities(image_features, text_features, model.logit_scale.exp())[:, 0]
    torch.testing.assert_close(out.scores, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.details["pair_probs"][:, 0], expected, atol=1e-5, rtol=0)


def test_open_clip_ensemble_and_fixed_logit_scale(tiny_open_clip, images):
    folder, model, preprocess, tokenizer, config = tiny_open_clip
    reward = load_reward(
        "clip_iqa",
        model=TINY_OPEN_CLIP_NAME,
        pretrained=str(folder / OPEN_CLIP_WEIGHTS_NAME),
        model_config=config,
        prompt_pairs=CLIP_IQA_ENSEMBLE_PAIRS,
        logit_scale=50.0,
    )
    out = reward(images, None)
    texts = [text for pair in CLIP_IQA_ENSEMBLE_PAIRS for text in pair]
    with torch.no_grad():
        image_features = model.encode_image(torch.stack([preprocess(to_pil(image)) for image in images]))
        text_features = model.encode_text(tokenizer(texts))
    probs = pair_probabilities(image_features, text_features, 50.0)  # (B, 3)
    torch.testing.assert_close(out.details["pair_probs"], probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.scores, probs.mean(-1), atol=1e-5, rtol=0)


def test_gradients_reach_the_pixels(tiny_hf_clip):
    reward = CLIPIQAReward(backend="transformers", model=str(tiny_hf_clip[0]))
    assert reward.differentiable
    images = uint8_images(2, 40, 48, seed=4).requires_grad_(True)  # resized on tensors
    reward(images, None).scores.sum().backward()
    assert torch.isfinite(images.grad).all() and images.grad.abs().sum() > 0


def test_bad_prompt_pairs(tiny_hf_clip):
    with pytest.raises(ValueError, match="prompt_pairs"):
        CLIPIQAReward(backend="transformers", model=str(tiny_hf_clip[0]), prompt_pairs=[("Good photo.",)])
