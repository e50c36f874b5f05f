"""JPEG (in)compressibility: the file size of each image saved as a JPEG.

Black et al., "Training Diffusion Models with Reinforcement Learning" (DDPO), ICLR 2024, Sec. 5:
the image is quantised to uint8 (``round(255 x)``), encoded by PIL as JPEG at quality 95, and
its size taken in kilobytes (bytes / 1000). Compressibility rewards small files (-size),
incompressibility large ones (+size). A toy reward with no model, useful to test RL end to end;
not differentiable (the encoder is discrete).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image

from genalign.rewards.base import Reward, RewardOutput, register_reward


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """``[B, 3, H, W]`` in [0, 1] -> ``[B, H, W, 3]`` uint8 on the CPU (DDPO's quantisation)."""
    return (images.detach() * 255).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).cpu()


def jpeg_sizes_kb(images: torch.Tensor, quality: int = 95) -> torch.Tensor:
    """JPEG size in kB (1000 bytes) of each image, ``[B]`` float32."""
    sizes = []
    for pixels in to_uint8(images).numpy():
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000.0)
    return torch.tensor(sizes, dtype=torch.float32)


class _JPEGSizeReward(Reward):
    sign: float = 1.0

    def __init__(self, quality: int = 95, strict: bool = False) -> None:
        super().__init__(strict=strict)
        if not 1 <= quality <= 100:
            raise ValueError(f"{self.name}: JPEG quality must be in [1, 100], got {quality}")
        self.quality = quality

    def score(self, images: torch.Tensor, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        sizes = jpeg_sizes_kb(images, self.quality).to(images.device)
        return RewardOutput(self.sign * sizes, {"jpeg_kb": sizes})

    def extra_repr(self) -> str:
        return f"quality={self.quality}"


@register_reward("jpeg_compressibility")
class JPEGCompressibilityReward(_JPEGSizeReward):
    """``-size_kB`` of the quality-95 JPEG (DDPO). Scores ``[B]`` < 0: a 512 px image scores about
    -5 (flat grey) to -300 (uniform noise), -40 for a smooth one; ``details["jpeg_kb"]`` holds the
    sizes. Prompts are ignored."""

    sign = -1.0


@register_reward("jpeg_incompressibility")
class JPEGIncompressibilityReward(_JPEGSizeReward):
    """``+size_kB`` of the quality-95 JPEG (DDPO). Scores ``[B]`` > 0 (5 to 300 at 512 px);
    ``details["jpeg_kb"]`` holds the sizes. Prompts are ignored."""

    sign = 1.0


# Deprecated aliases: class names spell acronyms in upper case (#22); the old names keep working.
JpegCompressibilityReward = JPEGCompressibilityReward
JpegIncompressibilityReward = JPEGIncompressibilityReward
