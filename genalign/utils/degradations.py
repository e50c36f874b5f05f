"""Q-Hawkeye's image degradations: noise, blur, repeated JPEG, darkening, then a second one.

Xie et al. 2026, "Q-Hawkeye" (arXiv 2601.22920; official ``src/Dataset/Degradation_Dataset/
Degradation.py`` and ``Second_Degradation.py`` @ 905262f) build the perception loss's pairs by
degrading each training image once (:data:`FIRST_STAGE`: Gaussian noise sigma 25 of 255, Gaussian
blur radius 3, JPEG quality 40 applied three times, brightness x0.6), filtering the pairs (a
Qwen2-VL judge, then a person; not reproduced here) and adding a second degradation of another
kind (:data:`SECOND_STAGE`: noise 65, blur 4, JPEG 5, brightness x0.5).

:func:`degradation_pair` does both stages on a ``[3, H, W]`` tensor in [0, 1], deterministically
given a seed (the kinds and the noise both come from it). Blur, JPEG and darkening are PIL's, as
the official scripts; the noise is drawn by torch and rounded to 8 bits.
"""

from __future__ import annotations

import io

import torch
from PIL import Image, ImageEnhance, ImageFilter

__all__ = ["DEGRADATION_KINDS", "FIRST_STAGE", "SECOND_STAGE", "degradation_pair", "degrade_image"]

DEGRADATION_KINDS = ("noise", "blur", "jpeg", "darken")
# kind -> strength: noise std in 0-255 units, blur radius in pixels, JPEG quality, brightness factor
FIRST_STAGE = {"noise": 25.0, "blur": 3.0, "jpeg": 40, "darken": 0.6}
SECOND_STAGE = {"noise": 65.0, "blur": 4.0, "jpeg": 5, "darken": 0.5}
JPEG_PASSES = 3  # the official JPEG degradation re-compresses three times


def _to_pil(image: torch.Tensor) -> Image.Image:
    pixels = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu()
    return Image.fromarray(pixels.numpy())


def _to_tensor(image: Image.Image) -> torch.Tensor:
    pixels = torch.frombuffer(bytearray(image.convert("RGB").tobytes()), dtype=torch.uint8)
    return pixels.view(image.height, image.width, 3).permute(2, 0, 1).float() / 255.0


def degrade_image(
    image: torch.Tensor, kind: str, strength: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``image`` ``[3, H, W]`` in [0, 1] degraded by ``kind`` at ``strength`` (module docstring);
    8-bit values in [0, 1]. ``generator`` draws the noise (None: torch's global generator)."""
    if image.ndim != 3 or image.shape[0] != 3:
        raise ValueError(f"image must be [3, H, W], got {tuple(image.shape)}")
    if kind == "noise":
        noise = torch.randn(image.shape, generator=generator) * (float(strength) / 255.0)
        noisy = (image.detach().float().cpu() * 255).round() / 255.0 + noise
        return _to_tensor(_to_pil(noisy))
    pil = _to_pil(image)
    if kind == "blur":
        return _to_tensor(pil.filter(ImageFilter.GaussianBlur(radius=float(strength))))
    if kind == "darken":
        return _to_tensor(ImageEnhance.Brightness(pil).enhance(float(strength)))
    if kind == "jpeg":
        for _ in range(JPEG_PASSES):
            buffer = io.BytesIO()
            pil.save(buffer, format="JPEG", quality=int(strength))
            pil = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
        return _to_tensor(pil)
    raise ValueError(f"degradation kind must be one of {DEGRADATION_KINDS}, got {kind!r}")


def degradation_pair(
    image: torch.Tensor,
    seed: int,
    kinds: tuple[str, ...] = DEGRADATION_KINDS,
    first_stage: dict[str, float] | None = None,
    second_stage: dict[str, float] | None = None,
) -> tuple[torch.Tensor, str, str]:
    """``(degraded, first_kind, second_kind)``: ``image`` degraded by a kind drawn from ``kinds`` at
    its first-stage strength, then by a different kind at its second-stage strength (Q-Hawkeye's
    pair construction without the filters). A function of ``(image, seed)``."""
    if len(set(kinds)) < 2 or not set(kinds) <= set(DEGRADATION_KINDS):
        raise ValueError(f"kinds must name at least two of {DEGRADATION_KINDS}, got {kinds!r}")
    first_stage = {**FIRST_STAGE, **(first_stage or {})}
    second_stage = {**SECOND_STAGE, **(second_stage or {})}
    generator = torch.Generator().manual_seed(int(seed))
    first = kinds[int(torch.randint(len(kinds), (1,), generator=generator))]
    others = [k for k in kinds if k != first]
    second = others[int(torch.randint(len(others), (1,), generator=generator))]
    once = degrade_image(image, first, first_stage[first], generator)
    return degrade_image(once, second, second_stage[second], generator), first, second
