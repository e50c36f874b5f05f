"""Tensor preprocessing vs the PIL pipelines the reward models were trained with.

Tolerance (in [0, 1] pixel units, i.e. after undoing the normalisation): the remaining difference
is PIL's rounding to uint8 after each resampling pass, so at most about 1 grey level; we allow
1.5/255 per pixel and 0.5/255 on average. Non-square resizes of pure noise are checked on the
average only: recent Pillow (13 here) picks the order of its two passes by cost, and with the uint8 clip of
the intermediate image (bicubic overshoot) rare pixels then differ by more.
"""

from __future__ import annotations

import numpy as np
import open_clip
import pytest
import torch
from transformers import CLIPImageProcessor
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from genalign.rewards.preprocess import (
    OPENAI_CLIP_STD,
    PreprocessConfig,
    center_crop,
    preprocess_images,
    shortest_edge_size,
)

from .helpers import smooth_images, to_pil, uint8_images

MAX_PIXEL_ERROR = 1.5 / 255
MEAN_PIXEL_ERROR = 0.5 / 255


def pixel_errors(ours: torch.Tensor, reference: torch.Tensor, std=OPENAI_CLIP_STD) -> tuple[float, float]:
    assert ours.shape == reference.shape, (ours.shape, reference.shape)
    scale = torch.tensor(std).view(1, 3, 1, 1)
    error = (ours - reference).abs() * scale  # back to [0, 1] pixel units
    return float(error.max()), float(error.mean())


# (height, width) -> every direction: identity, down, up, non-square, odd crop offsets
SIZES = [(32, 32), (64, 64), (20, 20), (64, 48), (20, 30), (33, 57), (100, 37)]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ["noise", "smooth"])
def test_matches_open_clip_preprocess(tiny_open_clip, size, kind):
    height, width = size
    images = uint8_images(2, height, width) if kind == "noise" else smooth_images(2, height, width)
    config = PreprocessConfig.from_open_clip(tiny_open_clip.model.visual.preprocess_cfg)
    reference = torch.stack([tiny_open_clip.preprocess(to_pil(image)) for image in images])
    worst, mean = pixel_errors(preprocess_images(images, config), reference)
    assert mean <= MEAN_PIXEL_ERROR
    if kind == "smooth" or height == width:
        assert worst <= MAX_PIXEL_ERROR


@pytest.mark.parametrize("processor_class", [CLIPImageProcessor, CLIPImageProcessorPil])
@pytest.mark.parametrize("size", SIZES)
def test_matches_transformers_clip_image_processor(processor_class, size):
    height, width = size
    images = smooth_images(2, height, width, seed=1)
    processor = processor_class(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    config = PreprocessConfig.from_image_processor(processor)
    reference = processor(images=[to_pil(image) for image in images], return_tensors="pt")["pixel_values"]
    worst, mean = pixel_errors(preprocess_images(images, config), reference)
    assert worst <= MAX_PIXEL_ERROR and mean <= MEAN_PIXEL_ERROR


def test_default_224_pipelines_agree_with_the_libraries():
    """Real-model settings: open_clip's default inference transform and CLIPImageProcessor()."""
    images = smooth_images(1, 300, 260, seed=2)
    open_clip_config = PreprocessConfig.from_open_clip({"size": 224})
    reference = open_clip.image_transform(224, is_train=False)(to_pil(images[0]))[None]
    assert max(pixel_errors(preprocess_images(images, open_clip_config), reference)) <= MAX_PIXEL_ERROR
    processor = CLIPImageProcessor()
    hf_config = PreprocessConfig.from_image_processor(processor)
    assert hf_config.size == (224, 224) and hf_config.crop_size == (224, 224)
    reference = processor(images=[to_pil(images[0])], return_tensors="pt")["pixel_values"]
    assert max(pixel_errors(preprocess_images(images, hf_config), reference)) <= MAX_PIXEL_ERROR


@pytest.mark.parametrize("resize_mode", ["longest", "squash"])
@pytest.mark.parametrize("size", [(64, 48), (20, 30), (32, 32)])
def test_other_open_clip_resize_modes(resize_mode, size):
    images = smooth_images(2, *size, seed=3)
    config = PreprocessConfig.from_open_clip({"size": 32, "resize_mode": resize_mode})
    transform = open_clip.image_transform(32, is_train=False, resize_mode=resize_mode)
    reference = torch.stack([transform(to_pil(image)) for image in images])
    worst, mean = pixel_errors(preprocess_images(images, config), reference)
    assert worst <= MAX_PIXEL_ERROR and mean <= MEAN_PIXEL_ERROR


def test_size_and_crop_conventions():
    # torchvision Resize(int): the long edge is truncated, not rounded
    assert shortest_edge_size(100, 37, 32) == (86, 32)
    assert shortest_edge_size(30, 20, 32) == (48, 32)
    image = torch.arange(5 * 5, dtype=torch.float32).view(1, 1, 5, 5)
    # torchvision rounds the offset (round(1.5) = 2), transformers floors it (1)
    assert center_crop(image, (2, 2), "round")[0, 0, 0, 0] == 2 * 5 + 2
    assert center_crop(image, (2, 2), "floor")[0, 0, 0, 0] == 1 * 5 + 1


def test_preprocess_is_differentiable():
    images = smooth_images(2, 40, 50).requires_grad_(True)
    config = PreprocessConfig.from_open_clip({"size": 32})
    out = preprocess_images(images, config)
    assert out.shape == (2, 3, 32, 32)
    (grad,) = torch.autograd.grad(out.square().sum(), images)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_half_precision_input_keeps_its_dtype():
    images = smooth_images(1, 40, 50).to(torch.bfloat16)
    out = preprocess_images(images, PreprocessConfig.from_open_clip({"size": 32}))
    assert out.dtype == torch.bfloat16 and out.shape == (1, 3, 32, 32)


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="resize_mode"):
        PreprocessConfig(resize_mode="crop")
    with pytest.raises(ValueError, match="interpolation"):
        PreprocessConfig(interpolation="lanczos")
    assert np.isclose(PreprocessConfig().mean[0], 0.48145466)
