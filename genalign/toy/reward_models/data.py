"""Training data of the toy reward models: scene banks of train prompts with the captions true of
each scene, one-attribute-changed captions (hard negatives) and the image degradations (blur,
noise, JPEG, downsampling) that stand in for a generator's imperfect samples."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from genalign.toy.captions import (
    COUNTS,
    caption_for_spec,
    color_attr_spec,
    colors_spec,
    counting_spec,
    position_spec,
    single_object_spec,
    two_object_spec,
)
from genalign.toy.prompts import PromptSpec, scene_for_spec
from genalign.toy.scenes import COLOURS, RELATIONS, SHAPES, Scene, render_scenes
from genalign.toy.shapes_eval import check_spec

ATTRIBUTES = ("shape", "count", "colour", "relation")
DEGRADATIONS = ("blur", "noise", "jpeg", "downsample")
# severity 0 (clean) .. 4 (worst) of each degradation; the rating levels follow them
SEVERITIES: dict[str, tuple[float, ...]] = {
    "blur": (0.0, 0.7, 1.3, 2.0, 3.0),  # Gaussian sigma, pixels of a 64 px image
    "noise": (0.0, 0.04, 0.09, 0.16, 0.28),  # Gaussian noise std
    "jpeg": (0.0, 55.0, 28.0, 14.0, 6.0),  # JPEG quality (0: none)
    "downsample": (1.0, 1.6, 2.3, 3.2, 4.5),  # factor of the down-then-up resize
}


def render_backend() -> str:
    """skia-python when installed (about 10x faster), else cairosvg."""
    try:
        import skia  # noqa: F401

        return "skia"
    except ImportError:
        return "cairosvg"


# -- one-attribute-changed captions ------------------------------------------------------------------


def one_attribute_variants(spec: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """Every spec of the grammar that differs from ``spec`` in one attribute, with that attribute.

    Attributes: ``shape`` (one object's class), ``count`` (counting), ``colour`` (one object's
    colour, or the two colours swapped between the objects: attribute binding) and ``relation``
    (another relation, or subject and target swapped). Only specs the grammar can write (two
    objects of different shapes and colours, counts in 2-4) are returned.
    """
    tag, include = spec["tag"], spec["include"]
    out: list[tuple[dict[str, Any], str]] = []
    if tag == "single_object":
        shape = include[0]["class"]
        out += [(single_object_spec(s), "shape") for s in SHAPES if s != shape]
    elif tag == "two_object":
        a, b = include[0]["class"], include[1]["class"]
        others = [s for s in SHAPES if s not in (a, b)]
        out += [(two_object_spec(s, b), "shape") for s in others]
        out += [(two_object_spec(a, s), "shape") for s in others]
    elif tag == "counting":
        shape, count = include[0]["class"], include[0]["count"]
        out += [(counting_spec(shape, n), "count") for n in COUNTS if n != count]
        out += [(counting_spec(s, count), "shape") for s in SHAPES if s != shape]
    elif tag == "colors":
        colour, shape = include[0]["color"], include[0]["class"]
        out += [(colors_spec(c, shape), "colour") for c in COLOURS if c != colour]
        out += [(colors_spec(colour, s), "shape") for s in SHAPES if s != shape]
    elif tag == "position":
        b, a = include[0]["class"], include[1]["class"]
        relation = include[1]["position"][0]
        out += [(position_spec(a, r, b), "relation") for r in RELATIONS if r != relation]
        out.append((position_spec(b, relation, a), "relation"))
        others = [s for s in SHAPES if s not in (a, b)]
        out += [(position_spec(s, relation, b), "shape") for s in others]
        out += [(position_spec(a, relation, s), "shape") for s in others]
    elif tag == "color_attr":
        (ca, sa), (cb, sb) = ((c["color"], c["class"]) for c in include)
        colours = [c for c in COLOURS if c not in (ca, cb)]
        out += [(color_attr_spec(c, sa, cb, sb), "colour") for c in colours]
        out += [(color_attr_spec(ca, sa, c, sb), "colour") for c in colours]
        out.append((color_attr_spec(cb, sa, ca, sb), "colour"))
        shapes = [s for s in SHAPES if s not in (sa, sb)]
        out += [(color_attr_spec(ca, s, cb, sb), "shape") for s in shapes]
        out += [(color_attr_spec(ca, sa, cb, s), "shape") for s in shapes]
    else:
        raise ValueError(f"unknown spec tag {tag!r}")
    return out


def false_variants(
    scene: Scene, spec: dict[str, Any], allowed: set[str] | None = None
) -> list[tuple[str, str]]:
    """``(caption, attribute)`` of the one-attribute variants of ``spec`` that are false of ``scene``
    (and, with ``allowed``, among those captions)."""
    out = []
    for variant, attribute in one_attribute_variants(spec):
        caption = caption_for_spec(variant)
        if allowed is not None and caption not in allowed:
            continue
        if not check_spec(scene.objects, variant).correct:
            out.append((caption, attribute))
    return out


# -- degradations -------------------------------------------------------------------------------------


def gaussian_blur(image: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of ``[3, H, W]`` (reflect padding); sigma in pixels."""
    if sigma <= 0:
        return image
    radius = max(1, int(math.ceil(3 * sigma)))
    x = torch.arange(-radius, radius + 1, dtype=image.dtype)
    kernel = torch.exp(-(x**2) / (2 * sigma**2))
    kernel = kernel / kernel.sum()
    pad = min(radius, image.shape[-1] - 1)
    if pad < radius:  # tiny image: truncate the kernel to what reflect padding allows
        kernel = kernel[radius - pad : radius + pad + 1]
        kernel = kernel / kernel.sum()
    batch = image[None]
    batch = F.conv2d(
        F.pad(batch, (pad, pad, 0, 0), mode="reflect"), kernel.view(1, 1, 1, -1).expand(3, 1, 1, -1), groups=3
    )
    batch = F.conv2d(
        F.pad(batch, (0, 0, pad, pad), mode="reflect"), kernel.view(1, 1, -1, 1).expand(3, 1, -1, 1), groups=3
    )
    return batch[0]


def jpeg(image: torch.Tensor, quality: int) -> torch.Tensor:
    """JPEG round trip of ``[3, H, W]`` in [0, 1] at ``quality`` (PIL)."""
    from PIL import Image

    pixels = (image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=int(quality))
    decoded = np.array(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))
    return torch.from_numpy(decoded).permute(2, 0, 1).float() / 255.0


def down_up(image: torch.Tensor, factor: float) -> torch.Tensor:
    """Downsample by ``factor`` (antialiased) and back up (bilinear): resolution loss."""
    if factor <= 1:
        return image
    size = image.shape[-1]
    small = max(4, int(round(size / factor)))
    low = F.interpolate(
        image[None], size=(small, small), mode="bilinear", antialias=True, align_corners=False
    )
    return F.interpolate(low, size=(size, size), mode="bilinear", align_corners=False)[0].clamp(0, 1)


def degrade(
    image: torch.Tensor, kind: str, severity: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``image`` ``[3, H, W]`` in [0, 1] degraded by ``kind`` at ``severity`` 0-4 (:data:`SEVERITIES`).

    Blur sigmas and downsampling factors are given for 64 px and scale with the image size.
    """
    if kind not in SEVERITIES:
        raise ValueError(f"degradation must be one of {DEGRADATIONS}, got {kind!r}")
    if not 0 <= severity < 5:
        raise ValueError(f"severity must be in 0..4, got {severity}")
    value = SEVERITIES[kind][severity]
    if severity == 0:
        return image
    scale = image.shape[-1] / 64
    if kind == "blur":
        return gaussian_blur(image, value * scale)
    if kind == "noise":
        noise = torch.randn(image.shape, generator=generator)
        return (image + value * noise).clamp(0, 1)
    if kind == "jpeg":
        return jpeg(image, int(value))
    return down_up(image, value)


def augment(image: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """A random generator-like imperfection of a clean render: colour jitter, blur, noise, JPEG and
    resolution loss, each mild enough that ShapesEval still reads the scene."""
    generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
    out = image
    if rng.random() < 0.8:  # global colour cast and contrast
        gain = torch.from_numpy(rng.uniform(0.93, 1.05, size=(3, 1, 1))).float()
        offset = torch.from_numpy(rng.uniform(-0.04, 0.04, size=(3, 1, 1))).float()
        out = (out * gain + offset).clamp(0, 1)
    if rng.random() < 0.3:
        out = down_up(out, float(rng.uniform(1.2, 2.2)))
    if rng.random() < 0.5:
        out = gaussian_blur(out, float(rng.uniform(0.2, 1.1)) * out.shape[-1] / 64)
    if rng.random() < 0.5:
        out = (out + float(rng.uniform(0.005, 0.06)) * torch.randn(out.shape, generator=generator)).clamp(
            0, 1
        )
    if rng.random() < 0.2:
        out = jpeg(out, int(rng.integers(45, 96)))
    return out


def augment_batch(images: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """:func:`augment` for a batch ``[B, 3, H, W]`` (same distribution, vectorised where it can be)."""
    count, _, size, _ = images.shape
    generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
    jitter = torch.from_numpy(rng.random(count) < 0.8).float().view(-1, 1, 1, 1)
    gain = 1 + jitter * (torch.from_numpy(rng.uniform(0.93, 1.05, size=(count, 3, 1, 1))).float() - 1)
    offset = jitter * torch.from_numpy(rng.uniform(-0.04, 0.04, size=(count, 3, 1, 1))).float()
    out = (images * gain + offset).clamp(0, 1)
    for i in np.flatnonzero(rng.random(count) < 0.3):
        out[i] = down_up(out[i], float(rng.uniform(1.2, 2.2)))
    sigma = np.where(rng.random(count) < 0.5, rng.uniform(0.2, 1.1, size=count), 0.0) * size / 64
    radius = max(1, int(math.ceil(3 * sigma.max()))) if sigma.max() > 0 else 0
    if radius:
        x = torch.arange(-radius, radius + 1, dtype=torch.float32)
        s = torch.from_numpy(np.maximum(sigma, 1e-3)).float().view(-1, 1)
        kernel = torch.exp(-(x**2) / (2 * s**2))
        kernel = torch.where(torch.from_numpy(sigma > 0).view(-1, 1), kernel, (x == 0).float())
        kernel = (kernel / kernel.sum(-1, keepdim=True)).repeat_interleave(3, dim=0)  # (3B, k)
        flat = out.reshape(1, count * 3, size, size)
        flat = F.conv2d(
            F.pad(flat, (radius, radius, 0, 0), mode="reflect"),
            kernel.view(-1, 1, 1, 2 * radius + 1),
            groups=3 * count,
        )
        flat = F.conv2d(
            F.pad(flat, (0, 0, radius, radius), mode="reflect"),
            kernel.view(-1, 1, 2 * radius + 1, 1),
            groups=3 * count,
        )
        out = flat.view(count, 3, size, size)
    noise = np.where(rng.random(count) < 0.5, rng.uniform(0.005, 0.06, size=count), 0.0)
    out = (
        out + torch.from_numpy(noise).float().view(-1, 1, 1, 1) * torch.randn(out.shape, generator=generator)
    ).clamp(0, 1)
    for i in np.flatnonzero(rng.random(count) < 0.2):
        out[i] = jpeg(out[i], int(rng.integers(45, 96)))
    return out


def to_size(image: torch.Tensor, size: int) -> torch.Tensor:
    """Resize ``[3, H, W]`` to ``size`` px (antialiased bilinear), as rendering at that size would."""
    if image.shape[-1] == size:
        return image
    return F.interpolate(
        image[None], size=(size, size), mode="bilinear", antialias=True, align_corners=False
    )[0]


# -- the scene bank ---------------------------------------------------------------------------------------


@dataclass
class SceneBank:
    """Rendered training scenes and, for every (scene, train caption), whether the caption is true.

    Attributes:
        prompts: the caption set (index space of ``satisfies``).
        scenes: the scenes; ``prompt_index[s]`` is the prompt scene s was drawn for.
        images: uint8 ``[S, 3, H, W]`` renders.
        satisfies: bool ``[S, P]``: prompt p's spec holds for scene s (checked on the scene).
        negatives: per scene, the prompt indices of its one-attribute-changed captions that are
            false of it (:func:`false_variants` within ``prompts``).
    """

    prompts: list[PromptSpec]
    scenes: list[Scene]
    prompt_index: np.ndarray
    images: torch.Tensor
    satisfies: np.ndarray
    negatives: list[list[int]]

    def image(self, index: int) -> torch.Tensor:
        return self.images[index].float() / 255.0

    def by_category(self) -> dict[str, np.ndarray]:
        categories = np.array([self.prompts[p].category for p in self.prompt_index])
        return {c: np.flatnonzero(categories == c) for c in dict.fromkeys(categories)}


def _count_features(objects: Sequence[tuple[str, str | None, int]]) -> np.ndarray:
    """Counts per shape (4) and per (shape, colour) (28) of ``(shape, colour or None, count)``."""
    features = np.zeros(len(SHAPES) * (1 + len(COLOURS)), dtype=np.int16)
    for shape, colour, count in objects:
        s = SHAPES.index(shape)
        features[s] += count
        if colour is not None:
            features[len(SHAPES) + s * len(COLOURS) + COLOURS.index(colour)] += count
    return features


def truth_matrix(scenes: Sequence[Scene], prompts: Sequence[PromptSpec]) -> np.ndarray:
    """bool ``[S, P]``: prompt p holds for scene s (``check_spec`` on the scene's own objects).

    A prompt can only hold when the scene has at least its objects (per shape and per shape and
    colour), which rules out most pairs with one vectorised comparison; the rest are checked.
    """
    need = np.stack(
        [
            _count_features([(c["class"], c.get("color"), c["count"]) for c in p.spec["include"]])
            for p in prompts
        ]
    )
    have = np.stack([_count_features([(o.shape, o.colour, 1) for o in scene.objects]) for scene in scenes])
    truth = np.zeros((len(scenes), len(prompts)), dtype=bool)
    for s, scene in enumerate(scenes):
        for p in np.flatnonzero((need <= have[s]).all(axis=1)):
            truth[s, p] = check_spec(scene.objects, prompts[p].spec).correct
    return truth


def build_bank(prompts: Sequence[PromptSpec], per_prompt: int, size: int, seed: int) -> SceneBank:
    """``per_prompt`` random scenes of every prompt, rendered at ``size`` px."""
    rng = np.random.default_rng(seed)
    scenes, index = [], []
    for p, prompt in enumerate(prompts):
        for _ in range(per_prompt):
            scenes.append(scene_for_spec(prompt.spec, rng))
            index.append(p)
    images = (render_scenes(scenes, size, render_backend()) * 255).round().to(torch.uint8)
    captions = {p.caption: i for i, p in enumerate(prompts)}
    negatives = [
        [captions[c] for c, _ in false_variants(scene, prompts[p].spec, set(captions))]
        for scene, p in zip(scenes, index)
    ]
    return SceneBank(list(prompts), scenes, np.array(index), images, truth_matrix(scenes, prompts), negatives)


def sample_scenes(bank: SceneBank, count: int, rng: np.random.Generator) -> np.ndarray:
    """Scene indices, category first (uniformly), then a scene of that category."""
    groups = list(bank.by_category().values())
    picks = rng.integers(len(groups), size=count)
    return np.array([groups[g][rng.integers(len(groups[g]))] for g in picks])
