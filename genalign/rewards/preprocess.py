"""Differentiable image preprocessing for CLIP-family rewards.

Reward models were trained on images that went through PIL: resize (bicubic, antialiased), centre
crop, ``ToTensor``, normalise with the model's own mean and std. Generators produce tensors, and
ReNO-style optimisation needs gradients from the score back to the pixels, so the same steps are
done here on float tensors ``[B, 3, H, W]`` in [0, 1] with ``torch.nn.functional.interpolate``.

How close this is to PIL: PIL resamples in two separable passes and rounds and clips to uint8
after each. :func:`resize` does the same two passes (width first, PIL's classic order) with
``antialias=True`` (torch then uses PIL's bicubic kernel, a = -0.5) and clamps to [0, 1] between
them, so what remains is PIL's uint8 rounding: at most about 1 grey level (1/255) per pixel, 0.3/255
on average. One exception: recent Pillow (13 here) picks the pass order by cost, and where it goes
height first on a non-square resize, pixels whose bicubic overshoot was clipped in the
intermediate image can differ by several grey levels on high-contrast noise (the average stays
under 0.5/255; smooth images are unaffected). ``tests/rewards/test_preprocess.py`` checks all of
this against open_clip's ``preprocess`` transform and transformers' CLIP image processors.

Conventions that differ between the two reference libraries, and are configurable here:

* resize of the shortest edge: the long edge becomes ``int(size * long / short)`` (both);
* centre-crop offset: torchvision ``CenterCrop`` (open_clip) uses ``int(round((H - h) / 2))``,
  transformers uses ``(H - h) // 2``; they differ by one pixel when ``H - h`` is odd.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

RESIZE_MODES = ("shortest", "longest", "squash")
CROP_ROUNDINGS = ("round", "floor")
INTERPOLATIONS = ("bicubic", "bilinear")
RESAMPLINGS = ("pil", "tensor")
# PIL.Image.Resampling values used by transformers' ``resample`` field.
_PIL_RESAMPLE = {2: "bilinear", 3: "bicubic"}


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return (size, size)
    size = tuple(int(s) for s in size)
    if len(size) == 1:
        return (size[0], size[0])
    if len(size) != 2:
        raise ValueError(f"expected an int or (height, width), got {size}")
    return size  # type: ignore[return-value]


@dataclass(frozen=True)
class PreprocessConfig:
    """One model's image preprocessing, as data.

    Attributes:
        size: resize target ``(height, width)``. With ``resize_mode="shortest"`` and a square
            target the shorter edge becomes ``size[0]`` and the aspect ratio is kept.
        crop_size: centre-crop ``(height, width)`` after the resize; None for no crop.
        mean, std: per-channel normalisation constants of the model (applied to [0, 1] pixels).
        interpolation: "bicubic" (every CLIP model) or "bilinear".
        resize_mode: "shortest" (cover the target, keep ratio, then crop), "longest" (fit inside,
            keep ratio, then pad to the crop size with ``fill``), "squash" (resize to the target
            exactly), or None for no resize.
        crop_rounding: "round" (torchvision / open_clip) or "floor" (transformers).
        fill: pad value in [0, 1] for "longest" (open_clip's ``fill_color`` / 255).
        resampling: "pil" (the model's transform resizes a PIL image: two separable passes, each
            clamped to [0, 1] as PIL's uint8 output is) or "tensor" (it resizes a float tensor, as
            HPSv2's does after ``ToTensor``: one antialiased interpolation, bicubic overshoot kept).
    """

    size: tuple[int, int] = (224, 224)
    crop_size: tuple[int, int] | None = (224, 224)
    mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    std: tuple[float, float, float] = OPENAI_CLIP_STD
    interpolation: str = "bicubic"
    resize_mode: str | None = "shortest"
    crop_rounding: str = "round"
    fill: float = 0.0
    resampling: str = "pil"

    def __post_init__(self) -> None:
        if self.resampling not in RESAMPLINGS:
            raise ValueError(f"resampling must be one of {RESAMPLINGS}, got {self.resampling!r}")
        if self.resize_mode is not None and self.resize_mode not in RESIZE_MODES:
            raise ValueError(f"resize_mode must be one of {RESIZE_MODES} or None, got {self.resize_mode!r}")
        if self.crop_rounding not in CROP_ROUNDINGS:
            raise ValueError(f"crop_rounding must be one of {CROP_ROUNDINGS}, got {self.crop_rounding!r}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {self.interpolation!r}")
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ValueError(f"mean and std need 3 channels, got mean={self.mean} std={self.std}")

    @classmethod
    def from_open_clip(cls, preprocess_cfg: Mapping[str, Any]) -> PreprocessConfig:
        """From an open_clip model's ``model.visual.preprocess_cfg`` (what its ``preprocess`` uses)."""
        size = _pair(preprocess_cfg.get("size", 224))
        mean = preprocess_cfg.get("mean", OPENAI_CLIP_MEAN)
        std = preprocess_cfg.get("std", OPENAI_CLIP_STD)
        mean = (float(mean),) * 3 if isinstance(mean, (int, float)) else tuple(float(m) for m in mean)
        std = (float(std),) * 3 if isinstance(std, (int, float)) else tuple(float(s) for s in std)
        resize_mode = preprocess_cfg.get("resize_mode", "shortest")
        return cls(
            size=size,
            crop_size=None if resize_mode == "squash" else size,
            mean=mean,  # type: ignore[arg-type]
            std=std,  # type: ignore[arg-type]
            interpolation=preprocess_cfg.get("interpolation", "bicubic"),
            resize_mode=resize_mode,
            crop_rounding="round",
            fill=float(preprocess_cfg.get("fill_color", 0)) / 255.0,
        )

    @classmethod
    def from_image_processor(cls, processor: Any) -> PreprocessConfig:
        """From a transformers image processor (``CLIPImageProcessor`` and its PIL twin).

        Reads ``size`` (``{"shortest_edge": n}`` or ``{"height", "width"}``), ``crop_size``,
        ``do_resize``/``do_center_crop``/``do_normalize``, ``image_mean``/``image_std`` and
        ``resample``. ``do_rescale`` is implied: our inputs are already in [0, 1].
        """
        processor = getattr(processor, "image_processor", processor)

        def field(name: str, default: Any = None) -> Any:
            value = getattr(processor, name, default)
            return default if value is None else value

        size = dict(field("size", {"shortest_edge": 224}))
        resize_mode: str | None
        if not field("do_resize", True):
            resize_mode, target = None, (0, 0)
        elif size.get("shortest_edge") and not size.get("longest_edge"):
            resize_mode, target = "shortest", _pair(int(size["shortest_edge"]))
        elif size.get("height") and size.get("width"):
            resize_mode, target = "squash", (int(size["height"]), int(size["width"]))
        else:
            raise ValueError(f"unsupported image processor size {size}")
        crop = dict(field("crop_size", {}))
        crop_size = (
            (int(crop["height"]), int(crop["width"])) if field("do_center_crop", False) and crop else None
        )
        resample = field("resample", 3)
        resample = int(getattr(resample, "value", resample))
        if resample not in _PIL_RESAMPLE:
            raise ValueError(f"unsupported resample {resample}; supported: {sorted(_PIL_RESAMPLE)}")
        if field("do_normalize", True):
            mean = tuple(float(m) for m in field("image_mean", OPENAI_CLIP_MEAN))
            std = tuple(float(s) for s in field("image_std", OPENAI_CLIP_STD))
        else:
            mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
        return cls(
            size=target,
            crop_size=crop_size,
            mean=mean,  # type: ignore[arg-type]
            std=std,  # type: ignore[arg-type]
            interpolation=_PIL_RESAMPLE[resample],
            resize_mode=resize_mode,
            crop_rounding="floor",
        )


def shortest_edge_size(height: int, width: int, target: int) -> tuple[int, int]:
    """Size after resizing the shorter edge to ``target`` (torchvision ``Resize(int)`` rule)."""
    if width <= height:
        return int(target * height / width), target
    return target, int(target * width / height)


def keep_ratio_size(height: int, width: int, target: tuple[int, int], longest: bool) -> tuple[int, int]:
    """Size that covers (``longest=False``) or fits inside (``longest=True``) ``target``.

    The rule of timm's / open_clip's ``ResizeKeepRatio``: ratio = max or min of the per-axis
    ratios, each side ``round(side / ratio)``.
    """
    ratio_h, ratio_w = height / target[0], width / target[1]
    ratio = max(ratio_h, ratio_w) if longest else min(ratio_h, ratio_w)
    return round(height / ratio), round(width / ratio)


def resize(
    images: torch.Tensor, size: tuple[int, int], interpolation: str = "bicubic", resampling: str = "pil"
) -> torch.Tensor:
    """PIL-like antialiased resize of ``[B, C, H, W]`` images in [0, 1] to ``size = (h, w)``.

    Two separable passes, width first (PIL's classic order), each clamped to [0, 1] as PIL's uint8
    output is;
    an axis that keeps its size is not resampled. Differentiable (the clamp passes gradients for
    pixels inside [0, 1]). ``resampling="tensor"``: torchvision's resize of a float tensor instead,
    one antialiased interpolation without a clamp.
    """
    height, width = images.shape[-2:]
    if resampling == "tensor":
        if (height, width) == tuple(size):
            return images
        return F.interpolate(
            images, size=tuple(size), mode=interpolation, antialias=True, align_corners=False
        )
    out_h, out_w = size
    if out_w != width:
        images = F.interpolate(
            images, size=(height, out_w), mode=interpolation, antialias=True, align_corners=False
        )
        images = images.clamp(0.0, 1.0)
    if out_h != height:
        images = F.interpolate(
            images, size=(out_h, out_w), mode=interpolation, antialias=True, align_corners=False
        )
        images = images.clamp(0.0, 1.0)
    return images


def center_crop(
    images: torch.Tensor, size: tuple[int, int], rounding: str = "round", fill: float = 0.0
) -> torch.Tensor:
    """Centre crop ``[B, C, H, W]`` to ``size = (h, w)``, padding with ``fill`` where it is larger.

    ``rounding="round"`` places the crop as torchvision's ``CenterCrop`` does
    (``int(round((H - h) / 2))``, Python's round-half-to-even), ``"floor"`` as transformers does.
    """
    height, width = images.shape[-2:]
    crop_h, crop_w = size
    if crop_h > height or crop_w > width:
        # torchvision pads left/top with the floor of half the deficit, as open_clip's crop-or-pad does
        pad_h, pad_w = max(crop_h - height, 0), max(crop_w - width, 0)
        images = F.pad(images, (pad_w // 2, (pad_w + 1) // 2, pad_h // 2, (pad_h + 1) // 2), value=fill)
        height, width = images.shape[-2:]
    if rounding == "round":
        top, left = int(round((height - crop_h) / 2.0)), int(round((width - crop_w) / 2.0))
    else:
        top, left = (height - crop_h) // 2, (width - crop_w) // 2
    return images[..., top : top + crop_h, left : left + crop_w]


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(x - mean) / std`` per channel on ``[B, 3, H, W]``."""
    mean_t = torch.as_tensor(mean, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    std_t = torch.as_tensor(std, dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    return (images - mean_t) / std_t


def preprocess_images(images: torch.Tensor, config: PreprocessConfig) -> torch.Tensor:
    """Resize, crop and normalise ``[B, 3, H, W]`` images in [0, 1] as ``config`` says.

    Returns ``[B, 3, h, w]`` model inputs (normalised, so roughly in [-2, 2.2] for CLIP constants),
    in the dtype of ``images``; computed in float32 when ``images`` is half precision, since the
    antialiased kernels are not implemented for it on every device.
    """
    dtype = images.dtype
    if dtype in (torch.float16, torch.bfloat16):
        images = images.float()
    height, width = images.shape[-2:]
    mode = config.resize_mode
    if mode == "shortest":
        if config.size[0] == config.size[1]:
            new_size = shortest_edge_size(height, width, config.size[0])
        else:
            new_size = keep_ratio_size(height, width, config.size, longest=False)
        images = resize(images, new_size, config.interpolation, config.resampling)
    elif mode == "longest":
        images = resize(
            images,
            keep_ratio_size(height, width, config.size, longest=True),
            config.interpolation,
            config.resampling,
        )
    elif mode == "squash":
        images = resize(images, config.size, config.interpolation, config.resampling)
    if config.crop_size is not None:
        images = center_crop(images, config.crop_size, config.crop_rounding, config.fill)
    return normalize(images, config.mean, config.std).to(dtype)


class ImagePreprocessor(torch.nn.Module):
    """``preprocess_images`` as a module, so a reward can hold it and print it."""

    def __init__(self, config: PreprocessConfig) -> None:
        super().__init__()
        self.config = config

    def forward(self, images: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W) -> (B, 3, h, w)
        return preprocess_images(images, self.config)

    def extra_repr(self) -> str:
        return repr(self.config)
