"""CLIPScore (Hessel et al. 2021) on both backends against an independent computation."""

from __future__ import annotations

import pytest
import torch

from genalign.rewards import load_reward
from genalign.rewards.clip_score import PAPER_PREFIX

from .helpers import PROMPTS, open_clip_cosine, smooth_images, to_pil, transformers_cosine, uint8_images


@pytest.fixture
def native_images():
    """32x32: the tiny models' own resolution, so preprocessing is only normalisation and the
    library pipelines agree with ours to float precision."""
    return uint8_images(4, 32, 32, seed=5)


def test_open_clip_clipscore_formula(tiny_open_clip, native_images):
    reward = load_reward(
        "clip",
        model=tiny_open_clip.name,
        pretrained=str(tiny_open_clip.weights),
        model_config=tiny_open_clip.config,
    )
    out = reward(native_images, PROMPTS)
    cosine = open_clip_cosine(tiny_open_clip, native_images, PROMPTS)
    torch.testing.assert_close(out.details["cosine"], cosine, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.scores, 2.5 * cosine.clamp(min=0), atol=1e-5, rtol=0)


def test_transformers_cosine_convention_with_paper_prefix(tiny_hf_clip, native_images):
    reward = load_reward(
        "clip",
        backend="transformers",
        model=str(tiny_hf_clip.folder),
        convention="cosine",
        prefix=PAPER_PREFIX,
    )
    expected = transformers_cosine(tiny_hf_clip, native_images, [f"A photo depicts {p}" for p in PROMPTS])
    torch.testing.assert_close(reward(native_images, PROMPTS).scores, expected, atol=1e-5, rtol=0)


def test_logit_convention_is_clips_own_logit(tiny_hf_clip, native_images):
    """ReNO's CLIP reward: ``exp(logit_scale) * cos`` (its loss is 100 minus it), the model's own
    image-text logit, here from transformers' ``CLIPModel`` forward."""
    reward = load_reward("clip", backend="transformers", model=str(tiny_hf_clip.folder), convention="logit")
    processor, model = tiny_hf_clip.processor, tiny_hf_clip.model
    with torch.no_grad():
        inputs = processor(
            text=PROMPTS, images=[to_pil(image) for image in native_images], padding=True, return_tensors="pt"
        )
        expected = model(**inputs).logits_per_image.diagonal()
    assert model.logit_scale.exp().item() != 1.0  # the scale is part of what is checked
    torch.testing.assert_close(reward(native_images, PROMPTS).scores, expected, atol=1e-4, rtol=0)


def test_custom_w_and_negative_cosines_clamp_to_zero(tiny_hf_clip, native_images):
    cosine_reward = load_reward(
        "clip", backend="transformers", model=str(tiny_hf_clip.folder), convention="cosine"
    )
    cosine = cosine_reward(native_images, PROMPTS).scores
    reward = load_reward("clip", backend="transformers", model=str(tiny_hf_clip.folder), w=1.0)
    torch.testing.assert_close(reward(native_images, PROMPTS).scores, cosine.clamp(min=0))


def test_resized_inputs_match_the_pil_pipeline(tiny_open_clip):
    """Non-native size: our tensor resize vs open_clip's PIL transform, within the preprocessing tolerance."""
    images = smooth_images(4, 40, 48, seed=6)
    reward = load_reward(
        "clip", model=tiny_open_clip.name, pretrained=str(tiny_open_clip.weights), convention="cosine"
    )
    expected = open_clip_cosine(tiny_open_clip, images, PROMPTS)
    torch.testing.assert_close(reward(images, PROMPTS).scores, expected, atol=2e-3, rtol=0)


def test_open_clip_hub_layout_folder_and_config_file(tiny_open_clip, native_images):
    """The same weights through ``local-dir:`` (hub layout) and a config JSON file."""
    from_folder = load_reward("clip", model=f"local-dir:{tiny_open_clip.folder}", pretrained=None)
    from_file = load_reward(
        "clip",
        model=tiny_open_clip.name,
        pretrained=str(tiny_open_clip.weights),
        model_config=str(tiny_open_clip.folder / f"{tiny_open_clip.name}.json"),
    )
    torch.testing.assert_close(
        from_folder(native_images, PROMPTS).scores, from_file(native_images, PROMPTS).scores
    )


def test_bad_convention():
    with pytest.raises(ValueError, match="convention"):
        load_reward("clip", convention="logits")
