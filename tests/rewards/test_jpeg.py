"""JPEG (in)compressibility (DDPO): sizes are PIL's encoded byte counts / 1000."""

from __future__ import annotations

import io

import pytest
import torch

from genalign.rewards import load_reward

from .helpers import smooth_images, to_pil, uint8_images


def pil_jpeg_kb(image: torch.Tensor, quality: int = 95) -> float:
    buffer = io.BytesIO()
    to_pil(image).save(buffer, format="JPEG", quality=quality)
    return len(buffer.getvalue()) / 1000


@pytest.mark.parametrize("quality", [95, 50])
def test_sizes_equal_pil_byte_counts(quality):
    images = torch.cat([uint8_images(2, 48, 40), smooth_images(2, 48, 40)])
    expected = torch.tensor([pil_jpeg_kb(image, quality) for image in images])
    incompressibility = load_reward("jpeg_incompressibility", quality=quality)(images, None)
    compressibility = load_reward("jpeg_compressibility", quality=quality)(images, None)
    torch.testing.assert_close(incompressibility.scores, expected)
    torch.testing.assert_close(compressibility.scores, -expected)
    torch.testing.assert_close(compressibility.details["jpeg_kb"], expected)
    assert (expected[:2] > expected[2:]).all()  # noise compresses worse than smooth images


def test_not_differentiable_and_no_graph():
    reward = load_reward("jpeg_compressibility")
    assert not reward.differentiable
    images = uint8_images(2, 16, 16).requires_grad_(True)
    assert not reward(images, None).scores.requires_grad


def test_quality_range():
    with pytest.raises(ValueError, match="quality"):
        load_reward("jpeg_compressibility", quality=0)
