"""HPS v2 / v2.1 (Wu et al. 2023): open_clip checkpoints in the official and other layouts."""

from __future__ import annotations

import pytest
import torch

from genalign.rewards import load_reward

from .helpers import PROMPTS, open_clip_cosine, smooth_images, uint8_images


@pytest.mark.parametrize("layout", ["official", "bare", "ddp", "safetensors"])
def test_checkpoint_layouts_score_the_cosine(tiny_open_clip, hps_checkpoints, layout):
    images = uint8_images(4, 32, 32, seed=8)
    reward = load_reward(
        "hpsv2",
        checkpoint=str(hps_checkpoints[layout]),
        model=tiny_open_clip.name,
        model_config=tiny_open_clip.config,
    )
    expected = open_clip_cosine(tiny_open_clip, images, PROMPTS)
    torch.testing.assert_close(reward(images, PROMPTS).scores, expected, atol=1e-5, rtol=0)


def hps_eval_pixels(image: torch.Tensor, size: int) -> torch.Tensor:
    """HPSv2's eval transform written out (its open_clip ``image_transform`` with
    ``resize_longest_max=True``): ToTensor, the longest side to ``size`` (bicubic, each side
    ``round(side * scale)``), black padding split floor-first, OpenAI CLIP normalisation."""
    import torchvision.transforms.functional as TF

    height, width = image.shape[1:]
    scale = size / max(height, width)
    new = [round(height * scale), round(width * scale)]
    resized = TF.resize(image, new, TF.InterpolationMode.BICUBIC, antialias=True)
    pad_h, pad_w = size - new[0], size - new[1]
    padded = TF.pad(resized, [pad_w // 2, pad_h // 2, pad_w - pad_w // 2, pad_h - pad_h // 2], fill=0)
    mean, std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
    return TF.normalize(padded, mean, std)


@pytest.mark.parametrize("shape", [(40, 64), (64, 40), (48, 48)], ids=["wide", "tall", "square"])
def test_non_square_images_are_padded_as_hps_scores_them_not_cropped(tiny_open_clip, hps_checkpoints, shape):
    reward = load_reward(
        "hpsv2",
        checkpoint=str(hps_checkpoints["official"]),
        model=tiny_open_clip.name,
        model_config=tiny_open_clip.config,
    )
    images = smooth_images(3, *shape, seed=4)
    size = reward.embedder.preprocess.config.size[0]
    pixels = torch.stack([hps_eval_pixels(image, size) for image in images])
    torch.testing.assert_close(reward.embedder.preprocess(images), pixels, atol=1e-5, rtol=0)
    with torch.no_grad():
        image_features = torch.nn.functional.normalize(tiny_open_clip.model.encode_image(pixels), dim=-1)
        text_features = torch.nn.functional.normalize(
            tiny_open_clip.model.encode_text(tiny_open_clip.tokenizer(PROMPTS[:3])), dim=-1
        )
    expected = (image_features * text_features).sum(-1)
    torch.testing.assert_close(reward(images, PROMPTS[:3]).scores, expected, atol=1e-5, rtol=0)


def test_missing_checkpoint_names_the_file(tiny_open_clip, tmp_path):
    missing = tmp_path / "HPS_v2.1_compressed.pt"
    with pytest.raises(FileNotFoundError, match="HPS_v2.1_compressed.pt"):
        load_reward("hpsv2", checkpoint=str(missing), model=tiny_open_clip.name)


def test_unknown_version():
    with pytest.raises(ValueError, match="v2.1"):
        load_reward("hpsv2", version="v3")
