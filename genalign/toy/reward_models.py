"""Learned reward models of the toy world: ``toy-clip`` and ``toy-vlm`` (issue #6), as runnable recipes.

Both are trained only on scenes of :func:`~genalign.toy.train_prompts` (their captions are the only
text they ever see) and are evaluated on the held-out prompts, whose combinations they never met.
They are the *rewards* of toy RL runs; ShapesEval, which they never see, is the verifier.

``toy-clip`` -- an open_clip CLIP of a small custom architecture (ViT on 64 px, 8 px patches; a
three-layer text transformer over open_clip's BPE) trained with CLIP's symmetric InfoNCE
(Radford et al. 2021, "Learning Transferable Visual Models From Natural Language Supervision",
Fig. 3) plus NegCLIP's hard negatives (Yuksekgonul et al. 2023, "When and Why Vision-Language
Models Behave like Bags-of-Words", Sec. 5: the same image with a caption that changes one
attribute). Because the toy grammar has entailment ("a photo of a circle" is true of every scene
with a circle), the contrastive targets are *all* captions true of a scene, not only its own:

    L_i2t = -1/B sum_i log sum_{t in P(i)} softmax_t(s * <v_i, u_t>)          over all train captions t
    L_t2i = -1/|T| sum_t log sum_{i in P(t)} softmax_i(s * <v_i, u_t>)         over the batch images i
    L_hn  = -1/B sum_i log softmax(s * <v_i, u_{c_i}>, s * <v_i, u_{n_i}>)_0    true c_i vs negative n_i
    L = (L_i2t + L_t2i) / 2 + lambda_hn * L_hn

with ``P(i)`` the captions whose GenEval spec holds for scene i (checked on the scene itself,
:func:`~genalign.toy.check_spec`), ``v``/``u`` the normalised image/text features and ``s`` CLIP's
learned temperature. With one positive per row and column this is exactly CLIP's loss
(``tests/toy/test_toy_reward_models.py`` checks it against ``F.cross_entropy``). Images are
augmented (colour jitter, blur, noise, JPEG, downscale-upscale, 48 px renders) so the model still
reads a generator's imperfect samples. Shipped in open_clip's hub layout, so
``load_reward("clip", model="local-dir:assets/models/toy-clip", pretrained=None)`` loads it.

``toy-vlm`` -- a LLaVA-1.5-style ``LlavaForConditionalGeneration`` (Liu et al. 2023; CLIP vision
tower, two-layer projector, Qwen2 language model) with a BPE tokenizer trained on the toy
grammar and a Qwen-style chat template. It is trained with next-token cross-entropy on the answer
token (the token the rewards read) of three instruction tasks, each rendered exactly as its reward
renders it (the templates are imported from the reward modules):

(a) VQAScore (Lin et al. 2024): ``Does this figure show "{caption}"? Please answer yes or no.``,
    "yes" for a true caption, "no" for a one-attribute-changed or a random false caption;
(b) RewardDance's comparative question (Wu et al. 2025, ``vlm_yes`` mode "comparative"): two
    images, "yes" when Image 1 is better -- it matches the prompt and the other does not, or it
    is the less degraded of two renders of one scene;
(c) Q-Align's rating (Wu et al. 2023, the ``iqa`` preset "qalign"): "How would you rate the
    quality of this image?" / "The quality of the image is" -> excellent, good, fair, poor, bad
    for renders degraded by blur, noise, JPEG or downsampling at severities 0-4.

Both are shipped (``assets/models/toy-clip``, ``assets/models/toy-vlm``; scores in their cards).
Two things made toy-vlm learn. Its vision tower is toy-clip's image encoder, frozen, read at the
penultimate layer as in LLaVA-1.5; a tower trained from scratch along with the LM collapsed to
image-independent features. And the true yes/no chats get a next-token loss on their question,
i.e. the caption is predicted from the image (``VlmRecipe.question_weight``); without it the answer
token stayed at its prior.

Recipes (``python -m genalign.toy.reward_models {toy-clip,toy-vlm} --out DIR --seed 0``) train,
save, evaluate (:func:`evaluate_reward_model` on the fixed held-out set of :func:`heldout_eval_set`)
and write the model card (``README.md``, ``card.json``).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
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
from genalign.toy.prompts import PromptSpec, heldout_prompts, scene_for_spec, train_prompts
from genalign.toy.scenes import COLOURS, RELATIONS, SHAPES, Scene, render_scenes
from genalign.toy.shapes_eval import check_spec

MODEL_NAMES = ("toy-clip", "toy-vlm")
ATTRIBUTES = ("shape", "count", "colour", "relation")
DEGRADATIONS = ("blur", "noise", "jpeg", "downsample")
# severity 0 (clean) .. 4 (worst) of each degradation; the rating levels follow them
SEVERITIES: dict[str, tuple[float, ...]] = {
    "blur": (0.0, 0.7, 1.3, 2.0, 3.0),  # Gaussian sigma, pixels of a 64 px image
    "noise": (0.0, 0.04, 0.09, 0.16, 0.28),  # Gaussian noise std
    "jpeg": (0.0, 55.0, 28.0, 14.0, 6.0),  # JPEG quality (0: none)
    "downsample": (1.0, 1.6, 2.3, 3.2, 4.5),  # factor of the down-then-up resize
}
EVAL_SEED = 20240806
EVAL_PER_CATEGORY = 64
SUBSET_SIZE = 20


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


def _sample_scenes(bank: SceneBank, count: int, rng: np.random.Generator) -> np.ndarray:
    """Scene indices, category first (uniformly), then a scene of that category."""
    groups = list(bank.by_category().values())
    picks = rng.integers(len(groups), size=count)
    return np.array([groups[g][rng.integers(len(groups[g]))] for g in picks])


def _progress(step: int, steps: int, start: float, max_minutes: float | None) -> float:
    """Fraction of training done: by steps, or by wall-clock time when that budget runs out first."""
    progress = step / steps
    if max_minutes:
        progress = max(progress, (time.time() - start) / (60 * max_minutes))
    return progress


def _lr_factor(step: int, progress: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to a tenth over the training progress."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


# -- toy-clip -------------------------------------------------------------------------------------------------


@dataclass
class ClipRecipe:
    """Architecture and training of ``toy-clip`` (defaults: the shipped model)."""

    seed: int = 0
    image_size: int = 48
    patch_size: int = 8
    vision_width: int = 64
    vision_layers: int = 3
    vision_head_width: int = 32
    text_width: int = 64
    text_heads: int = 4
    text_layers: int = 2
    context_length: int = 20
    embed_dim: int = 64
    scenes_per_prompt: int = 8
    steps: int = 3000
    batch_size: int = 48
    extra_captions: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup: int = 100
    hard_negative_weight: float = 1.0
    render_48_probability: float = 0.4
    log_every: int = 25
    max_minutes: float | None = None  # wall-clock budget of the training loop (None: steps only)

    def open_clip_config(self) -> dict[str, Any]:
        return {
            "embed_dim": self.embed_dim,
            "vision_cfg": {
                "image_size": self.image_size,
                "layers": self.vision_layers,
                "width": self.vision_width,
                "head_width": self.vision_head_width,
                "patch_size": self.patch_size,
            },
            "text_cfg": {
                "context_length": self.context_length,
                "vocab_size": 49408,
                "width": self.text_width,
                "heads": self.text_heads,
                "layers": self.text_layers,
            },
        }


def multi_positive_info_nce(logits: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """``-mean_rows log sum_{j positive} softmax(logits_row)_j`` over rows with a positive.

    With exactly one positive per row this is ``F.cross_entropy(logits, target)`` (CLIP's loss).
    """
    if logits.shape != positives.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and positives {tuple(positives.shape)} differ in shape"
        )
    log_probs = logits.log_softmax(dim=-1)
    per_row = -torch.logsumexp(log_probs.masked_fill(~positives, float("-inf")), dim=-1)
    valid = positives.any(dim=-1)
    if not bool(valid.any()):
        raise ValueError("no row has a positive")
    return per_row[valid].mean()


def clip_loss(
    image_features: torch.Tensor,
    text_features: torch.Tensor,
    logit_scale: torch.Tensor,
    positives: torch.Tensor,
    own_text: torch.Tensor,
    negative_text: torch.Tensor,
    hard_negative_weight: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The toy-clip loss (module docstring): symmetric multi-positive InfoNCE + hard negatives.

    ``image_features`` ``[B, D]``, ``text_features`` ``[T, D]`` (unnormalised), ``positives`` bool
    ``[B, T]`` (caption t true of image i), ``own_text`` / ``negative_text`` ``[B]`` indices of
    each image's own caption and its one-attribute-changed caption.
    """
    v = F.normalize(image_features, dim=-1)
    u = F.normalize(text_features, dim=-1)
    logits = logit_scale * v @ u.T  # (B, T)
    image_to_text = multi_positive_info_nce(logits, positives)
    columns = torch.unique(own_text)  # captions of the batch: their images are the text-side targets
    text_to_image = multi_positive_info_nce(logits[:, columns].T, positives[:, columns].T)
    rows = torch.arange(logits.shape[0])
    pair = torch.stack([logits[rows, own_text], logits[rows, negative_text]], dim=-1)  # (B, 2)
    hard = F.cross_entropy(pair, torch.zeros(len(rows), dtype=torch.long))
    loss = (image_to_text + text_to_image) / 2 + hard_negative_weight * hard
    parts = {
        "i2t": float(image_to_text.detach()),
        "t2i": float(text_to_image.detach()),
        "hard": float(hard.detach()),
    }
    return loss, parts


def _clip_batch(
    bank: SceneBank, recipe: ClipRecipe, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Augmented images ``[B, 3, H, W]``, the captions to encode ``[T]`` (prompt indices: the
    batch's own, their hard negatives and ``extra_captions`` random others), positives ``[B, T]``,
    and each image's own and negative caption as positions in that caption list."""
    rows = [s for s in _sample_scenes(bank, 4 * recipe.batch_size, rng) if bank.negatives[s]][
        : recipe.batch_size
    ]
    own = [int(bank.prompt_index[s]) for s in rows]
    negative = [bank.negatives[s][rng.integers(len(bank.negatives[s]))] for s in rows]
    extra = rng.choice(len(bank.prompts), size=recipe.extra_captions, replace=False).tolist()
    captions = list(dict.fromkeys(own + negative + extra))
    where = {p: i for i, p in enumerate(captions)}
    images = bank.images[rows].float() / 255.0
    small = rng.random(len(rows)) < recipe.render_48_probability
    if small.any():  # 48 px renders, back at the bank's size (the preprocessing resizes anyway)
        images[small] = F.interpolate(
            F.interpolate(images[small], size=(48, 48), mode="bilinear", antialias=True),
            size=images.shape[-2:],
            mode="bilinear",
        ).clamp(0, 1)
    images = augment_batch(images, rng)
    positives = torch.from_numpy(bank.satisfies[np.ix_(rows, captions)])
    return (
        images,
        torch.tensor(captions),
        positives,
        torch.tensor([where[p] for p in own]),
        torch.tensor([where[p] for p in negative]),
    )


def build_clip(recipe: ClipRecipe) -> tuple[torch.nn.Module, Any, Any]:
    """A freshly initialised open_clip model of the recipe's architecture: (model, tokenizer, preprocess)."""
    import open_clip

    from genalign.rewards.clip_models import register_open_clip_config
    from genalign.rewards.preprocess import ImagePreprocessor, PreprocessConfig

    name = register_open_clip_config(f"genalign-toy-clip-{recipe.seed}", recipe.open_clip_config())
    torch.manual_seed(recipe.seed)
    model = open_clip.create_model(name)
    tokenizer = open_clip.get_tokenizer(name)
    preprocess = ImagePreprocessor(PreprocessConfig.from_open_clip(model.visual.preprocess_cfg))
    return model, tokenizer, preprocess


def train_clip(
    recipe: ClipRecipe, bank: SceneBank | None = None, log: Callable[[str], None] = print
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Train toy-clip; returns the model and a log (``losses`` per step, ``seconds``, ``parameters``)."""
    start = time.time()
    rng = np.random.default_rng(recipe.seed)
    if bank is None:
        bank = build_bank(train_prompts(), recipe.scenes_per_prompt, recipe.image_size, recipe.seed)
    model, tokenizer, preprocess = build_clip(recipe)
    tokens = tokenizer([p.caption for p in bank.prompts])
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embedding" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embedding" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=recipe.lr,
        betas=(0.9, 0.98),
        eps=1e-6,
    )
    losses: list[float] = []
    model.train()
    for step in range(recipe.steps):
        progress = _progress(step, recipe.steps, start, recipe.max_minutes)
        if progress >= 1:
            break
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr * _lr_factor(step, progress, recipe.warmup)
        images, captions, positives, own, negatives = _clip_batch(bank, recipe, rng)
        image_features = model.encode_image(preprocess(images))
        text_features = model.encode_text(tokens[captions])
        loss, parts = clip_loss(
            image_features,
            text_features,
            model.logit_scale.exp(),
            positives,
            own,
            negatives,
            recipe.hard_negative_weight,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))  # CLIP's cap on the temperature
        losses.append(float(loss.detach()))
        if recipe.log_every and step % recipe.log_every == 0:
            log(
                f"toy-clip step {step} loss {loss:.4f} {parts} scale {float(model.logit_scale.exp()):.1f} ({time.time() - start:.0f}s)"
            )
    model.eval()
    parameters = sum(p.numel() for p in model.parameters())
    return model, {
        "losses": losses,
        "seconds": time.time() - start,
        "parameters": parameters,
        "steps": len(losses),
    }


@torch.no_grad()
def clip_batch_loss(model: torch.nn.Module, recipe: ClipRecipe, bank: SceneBank, seed: int) -> float:
    """The toy-clip loss of ``model`` on one batch drawn with ``seed`` (a fixed yardstick for training)."""
    _, tokenizer, preprocess = build_clip(recipe)
    images, captions, positives, own, negatives = _clip_batch(bank, recipe, np.random.default_rng(seed))
    tokens = tokenizer([p.caption for p in bank.prompts])[captions]
    loss, _ = clip_loss(
        model.encode_image(preprocess(images)),
        model.encode_text(tokens),
        model.logit_scale.exp(),
        positives,
        own,
        negatives,
        recipe.hard_negative_weight,
    )
    return float(loss)


def save_clip(model: torch.nn.Module, recipe: ClipRecipe, folder: str | Path) -> Path:
    """open_clip's hub layout (``open_clip_config.json`` + ``open_clip_model.safetensors``, fp16)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_cfg": recipe.open_clip_config(), "preprocess_cfg": dict(model.visual.preprocess_cfg)}
    (folder / "open_clip_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    state = {key: value.detach().to(torch.float16).contiguous() for key, value in model.state_dict().items()}
    save_file(state, str(folder / "open_clip_model.safetensors"))
    return folder


# -- toy-vlm ----------------------------------------------------------------------------------------------------


@dataclass
class VlmRecipe:
    """Architecture and training of ``toy-vlm``. The shipped model is these defaults with the
    options of the commands in its card (``vision_init``, ``vision_lr_scale=0``,
    ``vision_feature_layer=-2``, ``task_mix``, ``question_weight=1``, a 60-minute budget), then
    continued twice (``init``, a lower ``lr``, new seeds and so fresh scene banks with
    ``scenes_per_prompt=32``; 60 and 33 minutes)."""

    seed: int = 0
    image_size: int = 48
    patch_size: int = 12
    vision_width: int = 64
    vision_layers: int = 2
    vision_heads: int = 4
    hidden_size: int = 96
    intermediate_size: int = 256
    layers: int = 3
    heads: int = 4
    kv_heads: int = 2
    vocab_size: int = 640
    render_size: int = 64
    scenes_per_prompt: int = 8
    steps: int = 3000
    batch_size: int = 24
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup: int = 100
    task_mix: tuple[float, float, float] = (0.5, 0.25, 0.25)  # yes/no, comparative, rating
    render_48_probability: float = 0.4
    # a toy-clip folder whose image tower (converted to the transformers layout) starts the vision
    # tower; its architecture then replaces image_size/patch_size/vision_*
    vision_init: str | None = None
    # the vision tower's learning rate relative to ``lr``; 0 freezes it, as LLaVA keeps its CLIP
    # encoder frozen (Liu et al. 2023). Trained jointly from the first step, the tower collapsed to
    # image-independent features while the LM fitted the answer prior (measured: with a trainable
    # tower not even 20 fixed rating examples could be memorised in 100 steps; frozen, they were).
    vision_lr_scale: float = 1.0
    # which vision-tower layer the projector reads (LLaVA-1.5 reads the penultimate, -2)
    vision_feature_layer: int = -1
    # LLaVA's feature-alignment task (Liu et al. 2023, stage 1): "Describe this image." answered
    # with the scene's caption, a loss on every caption token: dense, word-level supervision of what
    # the image shows. Measured: it learns to caption (token loss 4.7 -> 0.15 in 2,900 steps), but
    # the one-token answers stayed at their priors in that run (see the issue #6 notes).
    caption_weight: float = 0.0
    caption_batch_size: int = 8
    # A next-token loss on the question of every yes/no chat whose answer is "yes" (the quoted
    # caption is then true of the image): the caption predicted from the image, in the very chat the
    # reward reads. Without it the answer token stayed at its prior (loss 0.67 after 1,400 steps on
    # every category; 0.69 after 1,350 on single-object colours alone): one answer token averages
    # over ~60 positions, so the image-word interaction it needs gets almost no gradient. With it
    # (weight 1) the yes/no loss fell to 0.41 in the same 1,400 steps (0.07 on colours alone).
    question_weight: float = 0.0
    # a toy-vlm folder whose weights start training: a run continued (new seed, new schedule,
    # fresh optimiser state); its architecture must be this recipe's
    init: str | None = None
    log_every: int = 25
    max_minutes: float | None = None  # wall-clock budget of the training loop (None: steps only)


RATING_WORDS = ("excellent", "good", "fair", "poor", "bad")  # severity 0..4, Q-Align's levels


def _vlm_templates() -> dict[str, Any]:
    """The reward modules' templates: training renders the chats they render."""
    from genalign.rewards.iqa import QALIGN_LEVELS, QALIGN_PROMPTS
    from genalign.rewards.vlm_yes import (
        COMPARATIVE_QUESTION,
        DEFAULT_CRITERIA,
        IMAGE_LABELS,
        VQASCORE_QUESTION,
    )

    if tuple(QALIGN_LEVELS) != RATING_WORDS:
        raise RuntimeError(f"Q-Align's levels changed to {tuple(QALIGN_LEVELS)}; update RATING_WORDS")
    return {
        "vqa": VQASCORE_QUESTION,
        "comparative": COMPARATIVE_QUESTION,
        "criteria": DEFAULT_CRITERIA,
        "labels": IMAGE_LABELS,
        "rating": QALIGN_PROMPTS[0],
    }


def vlm_tokenizer(vocab_size: int = 640):
    """Byte-level BPE trained on the toy grammar and the reward questions, as a ``Qwen2Tokenizer``
    with the Qwen-style chat template (so every caption word and answer word is one token)."""
    from transformers import Qwen2Tokenizer

    from genalign.tiny.language import IMAGE_TOKEN
    from genalign.tiny.tokenizers import QWEN_STYLE_CHAT_TEMPLATE, train_bpe_tokenizer

    templates = _vlm_templates()
    question, prefix = templates["rating"]
    corpus = [p.caption for p in train_prompts()]
    corpus += [templates["vqa"].format(prompt=c) for c in corpus[:50]]
    corpus += [templates["comparative"].format(prompt=c, criteria=templates["criteria"]) for c in corpus[:20]]
    corpus += [f"{question} {prefix} {word}." for word in RATING_WORDS] * 20
    corpus += ["yes", "no", "Yes", "No", "user", "assistant", "system", *templates["labels"]] * 20
    bpe = json.loads(train_bpe_tokenizer(corpus, vocab_size=vocab_size).backend_tokenizer.to_str())["model"]
    return Qwen2Tokenizer(
        vocab=bpe["vocab"],
        merges=[tuple(merge) for merge in bpe["merges"]],
        unk_token=None,
        eos_token="<|endoftext|>",
        pad_token="<pad>",
        extra_special_tokens=["<|im_start|>", "<|im_end|>", IMAGE_TOKEN],
        padding_side="left",
        model_max_length=1024,
        chat_template=QWEN_STYLE_CHAT_TEMPLATE,
    )


def _open_clip_vision(folder: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A saved toy-clip folder's ``vision_cfg`` and its image tower's weights (``visual.*``)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    config_file, weights_file = folder / "open_clip_config.json", folder / "open_clip_model.safetensors"
    for required in (config_file, weights_file):
        if not required.is_file():
            raise FileNotFoundError(
                f"vision_init {str(folder)!r} is not a toy-clip folder: {required.name} missing"
            )
    config = json.loads(config_file.read_text(encoding="utf-8"))["model_cfg"]
    weights = {
        k[len("visual.") :]: v for k, v in load_file(str(weights_file)).items() if k.startswith("visual.")
    }
    return config["vision_cfg"], weights


def open_clip_blocks_to_transformers(
    weights: dict[str, torch.Tensor], layers: int
) -> dict[str, torch.Tensor]:
    """open_clip's residual attention blocks (``transformer.resblocks.{i}.*``, of its image or text
    tower) renamed into transformers' CLIP ``encoder.layers.{i}.*``, the fused q/k/v split."""
    names = {
        "ln_1": "layer_norm1",
        "ln_2": "layer_norm2",
        "mlp.c_fc": "mlp.fc1",
        "mlp.c_proj": "mlp.fc2",
        "attn.out_proj": "self_attn.out_proj",
    }
    out = {}
    for i in range(layers):
        source, target = f"transformer.resblocks.{i}.", f"encoder.layers.{i}."
        for old, new in names.items():
            for kind in ("weight", "bias"):
                out[f"{target}{new}.{kind}"] = weights[f"{source}{old}.{kind}"]
        for kind in ("weight", "bias"):
            q, k, v = weights[f"{source}attn.in_proj_{kind}"].chunk(3)
            out[f"{target}self_attn.q_proj.{kind}"] = q
            out[f"{target}self_attn.k_proj.{kind}"] = k
            out[f"{target}self_attn.v_proj.{kind}"] = v
    return out


def open_clip_vision_to_transformers(
    weights: dict[str, torch.Tensor], layers: int
) -> dict[str, torch.Tensor]:
    """open_clip ``VisionTransformer`` weights renamed (and the fused q/k/v split) into the layout of
    transformers' ``CLIPVisionModel.vision_model``. The final ``proj`` is dropped: LLaVA reads the
    last layer's patch tokens, before ``ln_post`` and the projection."""
    out = {
        "embeddings.patch_embedding.weight": weights["conv1.weight"],
        "embeddings.class_embedding": weights["class_embedding"],
        "embeddings.position_embedding.weight": weights["positional_embedding"],
        "pre_layrnorm.weight": weights["ln_pre.weight"],
        "pre_layrnorm.bias": weights["ln_pre.bias"],
        "post_layernorm.weight": weights["ln_post.weight"],
        "post_layernorm.bias": weights["ln_post.bias"],
    }
    out.update(open_clip_blocks_to_transformers(weights, layers))
    return out


def build_vlm(recipe: VlmRecipe):
    """A freshly initialised LLaVA model and its processor (tokenizer, image processor, chat template).

    With ``recipe.vision_init`` (a toy-clip folder) the vision tower takes toy-clip's image-tower
    architecture and weights, as LLaVA starts from a pretrained CLIP encoder (Liu et al. 2023)."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        Qwen2Config,
    )

    from genalign.tiny.language import CLIP_IMAGE_MEAN, CLIP_IMAGE_STD, IMAGE_TOKEN
    from genalign.tiny.tokenizers import QWEN_STYLE_CHAT_TEMPLATE

    vision_weights = None
    if recipe.vision_init is not None:
        vision_cfg, clip_weights = _open_clip_vision(recipe.vision_init)
        if vision_cfg.get("width", 0) % vision_cfg.get("head_width", 64):
            raise ValueError(f"toy-clip vision width is not a multiple of its head width: {vision_cfg}")
        recipe = replace(
            recipe,
            image_size=int(vision_cfg["image_size"]),
            patch_size=int(vision_cfg["patch_size"]),
            vision_width=int(vision_cfg["width"]),
            vision_layers=int(vision_cfg["layers"]),
            vision_heads=int(vision_cfg["width"]) // int(vision_cfg.get("head_width", 64)),
        )
        vision_act = "quick_gelu" if vision_cfg.get("quick_gelu") else "gelu"
        vision_weights = open_clip_vision_to_transformers(clip_weights, recipe.vision_layers)
    else:
        vision_act = "quick_gelu"
    if recipe.image_size % recipe.patch_size:
        raise ValueError(
            f"image_size {recipe.image_size} must be a multiple of patch_size {recipe.patch_size}"
        )
    # A contrastive tower trains only its CLS token's last layer (the patch tokens of that layer
    # never reach the loss), so a toy-clip tower hands the LM its CLS token too ("full").
    strategy = "full" if vision_weights is not None else "default"
    tokenizer = vlm_tokenizer(recipe.vocab_size)
    text_config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.kv_heads,
        max_position_embeddings=tokenizer.model_max_length,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            image_size=recipe.image_size,
            patch_size=recipe.patch_size,
            hidden_size=recipe.vision_width,
            intermediate_size=4 * recipe.vision_width,
            num_hidden_layers=recipe.vision_layers,
            num_attention_heads=recipe.vision_heads,
            projection_dim=recipe.vision_width,
            hidden_act=vision_act,
        ),
        text_config=text_config,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=(recipe.image_size // recipe.patch_size) ** 2 + (strategy == "full"),
        projector_hidden_act="gelu",
        vision_feature_select_strategy=strategy,
        vision_feature_layer=recipe.vision_feature_layer,
        tie_word_embeddings=True,
    )
    torch.manual_seed(recipe.seed)
    model = LlavaForConditionalGeneration(config)
    if vision_weights is not None:
        tower = getattr(model, "model", model).vision_tower  # transformers 5 nests it under .model
        tower = getattr(tower, "vision_model", tower)  # a CLIPVisionModel wraps the transformer
        missing, unexpected = tower.load_state_dict(vision_weights, strict=False)
        if unexpected or [name for name in missing if "position_ids" not in name]:
            raise RuntimeError(
                f"toy-clip -> CLIPVisionModel mismatch: missing {missing}, unexpected {unexpected}"
            )
    model.generation_config.eos_token_id = [
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.eos_token_id,
    ]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": recipe.image_size},
        crop_size={"height": recipe.image_size, "width": recipe.image_size},
        do_center_crop=True,
        image_mean=CLIP_IMAGE_MEAN,
        image_std=CLIP_IMAGE_STD,
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=recipe.patch_size,
        vision_feature_select_strategy=strategy,
        num_additional_image_tokens=1,
        image_token=IMAGE_TOKEN,
        chat_template=QWEN_STYLE_CHAT_TEMPLATE,
    )
    return model, processor


def answer_token(tokenizer: Any, word: str) -> int:
    """The single token id of an answer word (an error when the tokenizer splits it)."""
    ids = tokenizer.encode(word, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(
            f"answer {word!r} is {len(ids)} tokens {tokenizer.convert_ids_to_tokens(ids)}; must be one"
        )
    return int(ids[0])


class VlmTasks:
    """Renders the three training chats exactly as ``vlm_yes`` / ``iqa`` render theirs."""

    def __init__(self, judge: Any) -> None:
        self.judge = judge
        self.templates = _vlm_templates()
        tokenizer = judge.tokenizer
        self.yes, self.no = answer_token(tokenizer, "yes"), answer_token(tokenizer, "no")
        self.levels = [answer_token(tokenizer, " " + word) for word in RATING_WORDS]

    def yes_no(self, caption: str) -> str:
        question = self.templates["vqa"].format(prompt=caption)
        return self.judge.render([self.judge.message("user", question, images=1)])

    def comparative(self, caption: str) -> str:
        t = self.templates
        question = t["comparative"].format(prompt=caption, criteria=t["criteria"])
        first, second = t["labels"]
        return self.judge.render(
            [self.judge.message("user", parts=[first, None, second, None, "\n" + question])]
        )

    def rating(self) -> str:
        question, prefix = self.templates["rating"]
        return self.judge.render([self.judge.message("user", question, images=1)], prefix)

    def description(self, caption: str) -> tuple[str, int]:
        """The captioning chat answered with ``caption``: (full text, number of answer tokens at
        its end, the closing ``<|im_end|>`` included)."""
        prompt = self.judge.render([self.judge.message("user", CAPTION_QUESTION, images=1)])
        answer = caption + "<|im_end|>"
        return prompt + answer, len(self.judge.tokenizer.encode(answer, add_special_tokens=False))


CAPTION_QUESTION = "Describe this image."


def caption_loss(
    model: torch.nn.Module, judge: Any, texts: Sequence[str], images: Sequence, lengths: Sequence[int]
):
    """Mean next-token cross-entropy over the last ``lengths[i]`` tokens of each (left-padded)
    chat: the answer tokens of :meth:`VlmTasks.description`."""
    inputs = judge.encode(texts, images)
    ids = inputs["input_ids"]
    scored = torch.zeros_like(ids, dtype=torch.bool)
    for row, length in enumerate(lengths):
        scored[row, ids.shape[1] - length :] = True
    return _next_token_loss(model(**inputs, use_cache=False).logits, ids, scored)


def _next_token_loss(logits: torch.Tensor, ids: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting each token where ``scored`` (bool, like ``ids``) is true
    from the position before it."""
    labels = torch.where(scored, ids, torch.full_like(ids, -100))
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=-100
    )


def question_loss(logits: torch.Tensor, inputs: Any, image_token_id: int, rows: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the text after the last image token (the question and the
    assistant header; padding excluded) of the chats selected by the boolean ``rows``.

    ``logits`` are the model's ``[B, L, V]`` outputs for ``inputs`` (left padded); a batch with no
    selected row gives 0."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"].bool()
    is_image = ids == image_token_id
    after_images = is_image.cumsum(1) == is_image.sum(1, keepdim=True)
    scored = after_images & ~is_image & mask & rows.view(-1, 1)
    if not scored[:, 1:].any():
        return logits.new_zeros(())
    return _next_token_loss(logits, ids, scored)


def _training_image(
    bank: SceneBank, index: int, recipe: VlmRecipe, rng: np.random.Generator, clean: bool = False
) -> torch.Tensor:
    """A bank image as toy-vlm trains on it: sometimes rendered at 48 px, then (unless ``clean``)
    a generator-like imperfection (:func:`augment`)."""
    image = bank.image(index)
    if rng.random() < recipe.render_48_probability:
        image = to_size(image, 48)
    return image if clean else augment(image, rng)


def _vlm_example(
    bank: SceneBank, recipe: VlmRecipe, rng: np.random.Generator, tasks: VlmTasks, task: int
) -> tuple[str, list[torch.Tensor], int] | None:
    """One training chat: (rendered text, its images, answer token id); None to redraw."""
    s = int(_sample_scenes(bank, 1, rng)[0])
    prompt = bank.prompts[bank.prompt_index[s]]

    def render(index: int, clean: bool = False) -> torch.Tensor:
        return _training_image(bank, index, recipe, rng, clean)

    if task == 0:  # VQAScore yes/no
        draw = rng.random()
        if draw < 0.5:
            return tasks.yes_no(prompt.caption), [render(s)], tasks.yes
        if draw < 0.85:
            if not bank.negatives[s]:
                return None
            caption = bank.prompts[bank.negatives[s][rng.integers(len(bank.negatives[s]))]].caption
        else:
            false = np.flatnonzero(~bank.satisfies[s])
            caption = bank.prompts[false[rng.integers(len(false))]].caption
        return tasks.yes_no(caption), [render(s)], tasks.no
    if task == 1:  # RewardDance comparison: better = matches the prompt / less degraded
        if rng.random() < 0.5:
            if not bank.negatives[s]:
                return None
            variant_index = bank.negatives[s][rng.integers(len(bank.negatives[s]))]
            # scenes drawn for the changed caption that do not happen to satisfy the prompt
            candidates = np.flatnonzero(
                (bank.prompt_index == variant_index) & ~bank.satisfies[:, bank.prompt_index[s]]
            )
            if not len(candidates):
                return None
            good, bad = render(s), render(int(candidates[rng.integers(len(candidates))]))
        else:
            generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
            low = int(rng.integers(0, 3))
            high = int(rng.integers(low + 2, 5))
            kind = DEGRADATIONS[rng.integers(len(DEGRADATIONS))]
            base = render(s, clean=True)
            good, bad = degrade(base, kind, low, generator), degrade(base, kind, high, generator)
        if rng.random() < 0.5:
            return tasks.comparative(prompt.caption), [good, bad], tasks.yes
        return tasks.comparative(prompt.caption), [bad, good], tasks.no
    # Q-Align rating: severity -> level
    severity = int(rng.integers(5))
    kind = DEGRADATIONS[rng.integers(len(DEGRADATIONS))]
    generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
    return tasks.rating(), [degrade(render(s, clean=True), kind, severity, generator)], tasks.levels[severity]


def _load_vlm_weights(model: torch.nn.Module, folder: str | Path) -> None:
    """Copy a saved toy-vlm's weights into ``model`` (the same architecture), or say what differs."""
    from transformers import LlavaForConditionalGeneration

    if not (Path(folder) / "config.json").exists():
        raise FileNotFoundError(f"init {str(folder)!r} is not a saved toy-vlm folder: config.json missing")
    saved = LlavaForConditionalGeneration.from_pretrained(str(folder)).state_dict()
    ours = model.state_dict()
    differs = sorted(
        name
        for name in ours.keys() | saved.keys()
        if name not in saved or name not in ours or saved[name].shape != ours[name].shape
    )
    if differs:
        raise ValueError(
            f"init {str(folder)!r} has another architecture than the recipe: {len(differs)} tensors differ, "
            f"e.g. {differs[:3]}"
        )
    model.load_state_dict(saved)


def train_vlm(
    recipe: VlmRecipe, bank: SceneBank | None = None, log: Callable[[str], None] = print
) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """Train toy-vlm: (model, processor, log with ``losses``, ``seconds``, ``parameters``)."""
    from genalign.rewards.vlm import VLMJudge

    start = time.time()
    rng = np.random.default_rng(recipe.seed)
    if bank is None:
        bank = build_bank(train_prompts(), recipe.scenes_per_prompt, recipe.render_size, recipe.seed)
    model, processor = build_vlm(recipe)
    if recipe.init is not None:
        _load_vlm_weights(model, recipe.init)
    judge = VLMJudge(model, processor, batch_size=recipe.batch_size)
    tasks = VlmTasks(judge)
    model.train().requires_grad_(True)
    if recipe.vision_lr_scale < 0:
        raise ValueError(f"vision_lr_scale must be >= 0, got {recipe.vision_lr_scale}")
    groups = []
    for vision in (False, True):
        named = [(n, p) for n, p in model.named_parameters() if ("vision_tower" in n) == vision]
        scale = recipe.vision_lr_scale if vision else 1.0
        if scale == 0:
            for _, param in named:
                param.requires_grad_(False)
            continue
        groups += [
            {
                "params": [p for n, p in named if p.ndim >= 2 and "embed" not in n],
                "weight_decay": recipe.weight_decay,
                "lr_scale": scale,
            },
            {
                "params": [p for n, p in named if not (p.ndim >= 2 and "embed" not in n)],
                "weight_decay": 0.0,
                "lr_scale": scale,
            },
        ]
    optimizer = torch.optim.AdamW(groups, lr=recipe.lr, betas=(0.9, 0.98))
    mix = np.asarray(recipe.task_mix, dtype=float)
    if mix.shape != (3,) or not np.isfinite(mix).all() or (mix < 0).any() or mix.sum() <= 0:
        raise ValueError(
            f"task_mix must be three non-negative shares (yes/no, comparative, rating) with a positive "
            f"sum, got {recipe.task_mix}"
        )
    mix = mix / mix.sum()
    losses: list[float] = []
    caption_losses: list[float] = []
    question_losses: list[float] = []
    for step in range(recipe.steps):
        progress = _progress(step, recipe.steps, start, recipe.max_minutes)
        if progress >= 1:
            break
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr * group["lr_scale"] * _lr_factor(step, progress, recipe.warmup)
        texts, images, answers, yes_no = [], [], [], []
        while len(texts) < recipe.batch_size:
            task = int(rng.choice(3, p=mix))
            example = _vlm_example(bank, recipe, rng, tasks, task)
            if example is not None:
                texts.append(example[0])
                images.append(example[1])
                answers.append(example[2])
                yes_no.append(task == 0)
        inputs = judge.encode(texts, images)
        keep = {} if recipe.question_weight > 0 else {"logits_to_keep": 1}
        all_logits = model(**inputs, use_cache=False, **keep).logits
        answer_tensor = torch.tensor(answers)
        loss = answer_loss = F.cross_entropy(all_logits[:, -1].float(), answer_tensor)
        rows = torch.tensor(yes_no) & (answer_tensor == tasks.yes)
        if recipe.question_weight > 0 and rows.any():
            asked = question_loss(all_logits, inputs, model.config.image_token_id, rows)
            question_losses.append(float(asked.detach()))
            loss = loss + recipe.question_weight * asked
        if recipe.caption_weight > 0:
            chats, pictures, lengths = [], [], []
            for s in _sample_scenes(bank, recipe.caption_batch_size, rng):
                text, length = tasks.description(bank.prompts[bank.prompt_index[int(s)]].caption)
                chats.append(text)
                pictures.append([_training_image(bank, int(s), recipe, rng)])
                lengths.append(length)
            described = caption_loss(model, judge, chats, pictures, lengths)
            caption_losses.append(float(described.detach()))
            loss = loss + recipe.caption_weight * described
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(answer_loss.detach()))
        if recipe.log_every and step % recipe.log_every == 0:
            recent = float(np.mean(losses[-recipe.log_every :]))
            described = (
                f" caption {np.mean(caption_losses[-recipe.log_every :]):.4f}" if caption_losses else ""
            )
            if question_losses:
                described += f" question {np.mean(question_losses[-recipe.log_every :]):.4f}"
            log(
                f"toy-vlm step {step} answer loss {answer_loss:.4f} (mean {recent:.4f}){described} "
                f"({time.time() - start:.0f}s)"
            )
    model.eval().requires_grad_(False)
    parameters = sum(p.numel() for p in model.parameters())
    return (
        model,
        processor,
        {
            "losses": losses,
            "caption_losses": caption_losses,
            "question_losses": question_losses,
            "seconds": time.time() - start,
            "parameters": parameters,
            "steps": len(losses),
        },
    )


def save_vlm(model: torch.nn.Module, processor: Any, folder: str | Path) -> Path:
    """``save_pretrained`` of model and processor: ``AutoModelForImageTextToText`` / ``AutoProcessor``."""
    folder = Path(folder)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


# -- the fixed held-out evaluation set -----------------------------------------------------------------------


@dataclass
class EvalItem:
    """One held-out evaluation case (everything derived from ``(EVAL_SEED, index)``)."""

    index: int
    category: str
    caption: str
    spec: dict[str, Any]
    scene: Scene
    negative: str  # a one-attribute-changed caption false of the scene
    attribute: str
    negative_spec: dict[str, Any]
    random_negative: str  # another held-out caption false of the scene
    image: torch.Tensor  # clean render [3, 64, 64]
    noisy: torch.Tensor  # the render as a blurry, noisy generator sample
    negative_image: torch.Tensor  # a render of the negative caption (false for ``caption``)
    degradation: str
    severity: int
    degraded: torch.Tensor  # ``image`` degraded by (degradation, severity)


def _eval_plan(per_category: int) -> list[tuple[int, PromptSpec]]:
    prompts = heldout_prompts()
    by_category: dict[str, list[PromptSpec]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt.category, []).append(prompt)
    plan = []
    for group in by_category.values():
        for k in range(per_category):
            plan.append(
                group[(k * len(group)) // per_category if len(group) >= per_category else k % len(group)]
            )
    return list(enumerate(plan))


def subset_indices(per_category: int = EVAL_PER_CATEGORY, size: int = SUBSET_SIZE) -> list[int]:
    """The small fixed subset (evenly spaced, so every category is in it) the cards report."""
    total = len(_eval_plan(per_category))
    return [int(i) for i in np.linspace(0, total - 1, size).round()]


def heldout_eval_set(
    per_category: int = EVAL_PER_CATEGORY, indices: Sequence[int] | None = None, seed: int = EVAL_SEED
) -> list[EvalItem]:
    """The fixed held-out evaluation set: ``per_category`` cases of each held-out category.

    Each case draws (from ``np.random.default_rng([seed, index])``, so any subset is built alone)
    a scene of a held-out prompt, a one-attribute-changed caption false of it (all attributes the
    category allows, uniformly), a random held-out caption false of it, a scene of the changed
    caption, and a degradation with a severity (``index % 5``). Rendered by cairosvg at 64 px.
    """
    plan = _eval_plan(per_category)
    heldout = heldout_prompts()
    items = []
    for index in indices if indices is not None else range(len(plan)):
        _, prompt = plan[index]
        rng = np.random.default_rng([seed, index])
        scene = scene_for_spec(prompt.spec, rng)
        variants = false_variants(scene, prompt.spec)
        attributes = sorted({a for _, a in variants})
        attribute = attributes[rng.integers(len(attributes))]
        choices = [
            (c, s)
            for (s, a) in one_attribute_variants(prompt.spec)
            for c in [caption_for_spec(s)]
            if a == attribute
        ]
        choices = [(c, s) for c, s in choices if c in {v for v, _ in variants}]
        negative, negative_spec = choices[rng.integers(len(choices))]
        false = [p for p in heldout if not check_spec(scene.objects, p.spec).correct]
        random_negative = false[rng.integers(len(false))].caption
        negative_scene = scene_for_spec(negative_spec, rng)
        while check_spec(negative_scene.objects, prompt.spec).correct:
            negative_scene = scene_for_spec(negative_spec, rng)
        image, negative_image = render_scenes([scene, negative_scene], 64)
        generator = torch.Generator().manual_seed(int(rng.integers(2**31)))
        noisy = (gaussian_blur(image, 0.8) + 0.03 * torch.randn(image.shape, generator=generator)).clamp(0, 1)
        degradation = DEGRADATIONS[(index // 5) % len(DEGRADATIONS)]
        severity = index % 5
        degraded = degrade(image, degradation, severity, generator)
        items.append(
            EvalItem(
                index,
                prompt.category,
                prompt.caption,
                prompt.spec,
                scene,
                negative,
                attribute,
                negative_spec,
                random_negative,
                image,
                noisy,
                negative_image,
                degradation,
                severity,
                degraded,
            )
        )
    return items


# -- evaluation -------------------------------------------------------------------------------------------------


def _per_category(items: Sequence[EvalItem], correct: Sequence[bool]) -> dict[str, float]:
    out: dict[str, list[bool]] = {}
    for item, ok in zip(items, correct):
        out.setdefault(item.category, []).append(bool(ok))
    return {category: float(np.mean(values)) for category, values in out.items()}


def _mean(values: Sequence[bool] | torch.Tensor) -> float:
    return float(torch.as_tensor(values, dtype=torch.float32).mean())


def load_toy_reward(name: str, path: str | Path, **kwargs: Any):
    """The public reward of a shipped toy model: ``clip`` for toy-clip; for toy-vlm ``vlm_yes``
    (pointwise), or with ``kind="comparative"`` / ``kind="iqa"`` those rewards."""
    from genalign.rewards import load_reward

    path = str(path)
    if name == "toy-clip":
        return load_reward("clip", model=f"local-dir:{path}", pretrained=None, **kwargs)
    if name == "toy-vlm":
        kind = kwargs.pop("kind", "pointwise")
        if kind == "iqa":
            return load_reward("iqa", model=path, preset="qalign", **kwargs)
        return load_reward("vlm_yes", model=path, mode=kind, **kwargs)
    raise ValueError(f"unknown toy reward model {name!r}; choose one of {MODEL_NAMES}")


def evaluate_reward_model(
    name: str, path: str | Path, items: Sequence[EvalItem] | None = None
) -> dict[str, Any]:
    """Scores of a saved toy reward model on held-out cases (default: :func:`heldout_eval_set`),
    loaded through the public reward API only.

    toy-clip: ``pair_accuracy`` (cosine of the true caption above the one-attribute-changed one;
    ``_noisy`` on blurred noisy renders; per category and per attribute), ``retrieval_accuracy``
    (the best of all held-out captions is true of the scene) and the mean cosines.
    toy-vlm: ``yes_no_accuracy`` (P(yes)/(P(yes)+P(no)) on the right side of 0.5 for the true,
    the changed and a random caption), ``pair_accuracy``, ``comparative_accuracy`` (prompt match
    and degradation pairs, both orders), ``rating_accuracy`` (most likely level word = severity)
    and ``rating_spearman`` (Q-Align score against -severity).
    """
    items = list(items) if items is not None else heldout_eval_set()
    if name == "toy-clip":
        return _evaluate_clip(path, items)
    if name == "toy-vlm":
        return _evaluate_vlm(path, items)
    raise ValueError(f"unknown toy reward model {name!r}; choose one of {MODEL_NAMES}")


@torch.no_grad()
def _evaluate_clip(path: str | Path, items: Sequence[EvalItem]) -> dict[str, Any]:
    reward = load_toy_reward("toy-clip", path, convention="cosine")
    captions = [i.caption for i in items]
    negatives = [i.negative for i in items]
    out: dict[str, Any] = {}
    for key, images in (
        ("", torch.stack([i.image for i in items])),
        ("_noisy", torch.stack([i.noisy for i in items])),
    ):
        positive = reward(images, captions).scores
        negative = reward(images, negatives).scores
        correct = (positive > negative).tolist()
        out[f"pair_accuracy{key}"] = _mean(correct)
        out[f"pair_accuracy{key}_by_category"] = _per_category(items, correct)
        by_attribute: dict[str, list[bool]] = {}
        for item, ok in zip(items, correct):
            by_attribute.setdefault(item.attribute, []).append(ok)
        out[f"pair_accuracy{key}_by_attribute"] = {a: _mean(v) for a, v in by_attribute.items()}
        out[f"mean_cosine_true{key}"] = float(positive.mean())
        out[f"mean_cosine_changed{key}"] = float(negative.mean())
        candidates = heldout_prompts()
        embedder = reward.embedder
        image_features = F.normalize(embedder.encode_images(images), dim=-1)
        text_features = F.normalize(embedder.encode_texts([p.caption for p in candidates]), dim=-1)
        best = (image_features @ text_features.T).argmax(dim=-1).tolist()
        retrieved = [
            check_spec(item.scene.objects, candidates[b].spec).correct for item, b in zip(items, best)
        ]
        out[f"retrieval_accuracy{key}"] = _mean(retrieved)
        out[f"retrieval_accuracy{key}_by_category"] = _per_category(items, retrieved)
    out["retrieval_candidates"] = len(heldout_prompts())
    return out


@torch.no_grad()
def _evaluate_vlm(path: str | Path, items: Sequence[EvalItem]) -> dict[str, Any]:
    from scipy.stats import spearmanr

    from genalign.rewards.iqa import QALIGN_LEVELS

    out: dict[str, Any] = {}
    pointwise = load_toy_reward("toy-vlm", path, batch_size=32)
    images = torch.stack([i.noisy for i in items])
    p_true = pointwise(images, [i.caption for i in items]).scores
    p_changed = pointwise(images, [i.negative for i in items]).scores
    p_random = pointwise(images, [i.random_negative for i in items]).scores
    correct = [
        bool(t > 0.5) and bool(c < 0.5) and bool(r < 0.5) for t, c, r in zip(p_true, p_changed, p_random)
    ]
    decisions = torch.cat([p_true > 0.5, p_changed < 0.5, p_random < 0.5])
    out["yes_no_accuracy"] = _mean(decisions)
    out["yes_no_accuracy_true"] = _mean(p_true > 0.5)
    out["yes_no_accuracy_changed"] = _mean(p_changed < 0.5)
    out["yes_no_accuracy_random"] = _mean(p_random < 0.5)
    out["yes_no_all_three_by_category"] = _per_category(items, correct)
    pair = (p_true > p_changed).tolist()
    out["pair_accuracy"] = _mean(pair)
    out["pair_accuracy_by_category"] = _per_category(items, pair)
    out["mean_p_yes_true"] = float(p_true.mean())
    out["mean_p_yes_changed"] = float(p_changed.mean())

    comparative = load_toy_reward("toy-vlm", path, kind="comparative", batch_size=32)
    prompts = [i.caption for i in items]
    good_match, bad_match = images, torch.stack([i.negative_image for i in items])
    clean, worse = (
        torch.stack([i.image for i in items]),
        torch.stack([degrade(i.image, "blur", 3) for i in items]),
    )
    results = {}
    for key, good, bad in (("match", good_match, bad_match), ("quality", clean, worse)):
        first = comparative(good, prompts, reference_images=bad).scores  # label yes
        second = comparative(bad, prompts, reference_images=good).scores  # label no
        results[key] = torch.cat([first > 0.5, second < 0.5])
        out[f"comparative_accuracy_{key}"] = _mean(results[key])
    out["comparative_accuracy"] = _mean(torch.cat(list(results.values())))

    iqa = load_toy_reward("toy-vlm", path, kind="iqa", batch_size=32)
    degraded = torch.stack([i.degraded for i in items])
    severities = torch.tensor([i.severity for i in items])
    scores = iqa(degraded, prompts).scores
    (_, word_logits), *_ = iqa.member_word_logits(degraded)
    levels = list(QALIGN_LEVELS)
    predicted = word_logits.argmax(dim=-1)  # index into (excellent ... bad) = severity
    if levels != list(RATING_WORDS):
        raise RuntimeError(f"unexpected Q-Align levels {levels}")
    out["rating_accuracy"] = _mean(predicted == severities)
    out["rating_within_one"] = _mean((predicted - severities).abs() <= 1)
    out["rating_spearman"] = float(spearmanr(scores.numpy(), -severities.numpy()).statistic)
    by_kind: dict[str, list[bool]] = {}
    for item, ok in zip(items, (predicted == severities).tolist()):
        by_kind.setdefault(item.degradation, []).append(ok)
    out["rating_accuracy_by_degradation"] = {k: _mean(v) for k, v in by_kind.items()}
    return out


def subset_scores(name: str, path: str | Path) -> dict[str, float]:
    """Mean reward scores on the small fixed subset (:func:`subset_indices`), for the card and tests."""
    items = heldout_eval_set(indices=subset_indices())
    captions = [i.caption for i in items]
    with torch.no_grad():
        if name == "toy-clip":
            reward = load_toy_reward(name, path, convention="cosine")
            images = torch.stack([i.noisy for i in items])
            true, changed = (
                reward(images, captions).scores,
                reward(images, [i.negative for i in items]).scores,
            )
            return {
                "mean_cosine_true": float(true.mean()),
                "mean_cosine_changed": float(changed.mean()),
                "pair_accuracy": _mean(true > changed),
            }
        if name == "toy-vlm":
            reward = load_toy_reward(name, path, batch_size=32)
            images = torch.stack([i.noisy for i in items])
            true, changed = (
                reward(images, captions).scores,
                reward(images, [i.negative for i in items]).scores,
            )
            iqa = load_toy_reward(name, path, kind="iqa", batch_size=32)
            rating = iqa(torch.stack([i.degraded for i in items]), captions).scores
            return {
                "mean_p_yes_true": float(true.mean()),
                "mean_p_yes_changed": float(changed.mean()),
                "pair_accuracy": _mean(true > changed),
                "mean_qalign_score": float(rating.mean()),
            }
    raise ValueError(f"unknown toy reward model {name!r}; choose one of {MODEL_NAMES}")


# -- model cards ------------------------------------------------------------------------------------------------


def folder_megabytes(folder: str | Path) -> float:
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file()) / 1e6


def _fmt(key: str, value: Any) -> str:
    if isinstance(value, float):
        return f"{100 * value:.1f}%" if "accuracy" in key or "within" in key else f"{value:.3f}"
    return str(value)


_EVAL_NOTES = {
    "toy-clip": "Pair accuracy: cosine(image, true caption) > cosine(image, one-attribute-changed caption). "
    "Retrieval: the best of all 208 held-out captions is true of the scene (checked on the scene).",
    "toy-vlm": "Yes/no on the noisy renders with a threshold of 0.5 on P(yes)/(P(yes)+P(no)) for the true, the "
    "one-attribute-changed and a random false held-out caption; pair = P(yes|true) > P(yes|changed). Comparative: "
    "(noisy render of the prompt vs clean render of the changed caption) and (clean vs blur severity 3), both "
    "orders, correct when P(yes) is on the right side of 0.5. Rating: renders degraded by one of blur / noise / "
    "JPEG / downsampling at severity 0-4 (case index mod 5); accuracy = most likely level word is the severity's; "
    "Spearman between the Q-Align score and -severity.",
}


def write_card(
    name: str,
    folder: str | Path,
    recipe: Any,
    training: dict[str, Any],
    scores: dict[str, Any],
    subset: dict[str, float],
    command: str,
) -> None:
    """``card.json`` (recipe, training, eval settings and scores) and a ``README.md`` from it."""
    folder = Path(folder)
    eval_settings = {
        "eval_set": "genalign.toy.reward_models.heldout_eval_set",
        "seed": EVAL_SEED,
        "per_category": EVAL_PER_CATEGORY,
        "categories": sorted({p.category for p in heldout_prompts()}),
        "subset_indices": subset_indices(),
        "subset_tolerance": 2e-3,
        "renderer": "cairosvg, 64 px",
        "noisy": "Gaussian blur sigma 0.8 px + Gaussian noise std 0.03",
    }
    card = {
        "name": name,
        "command": command,
        "recipe": asdict(recipe),
        "parameters": training["parameters"],
        "training_seconds": round(training["seconds"], 1),
        "training": training,
        "size_mb": round(folder_megabytes(folder), 2),
        "eval": eval_settings,
        "scores": scores,
        "subset_scores": subset,
    }
    (folder / "card.json").write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    lines = [f"# {name}", ""]
    if name == "toy-clip":
        lines += [
            "An open_clip CLIP trained from scratch on the toy shape world (genalign issue #6) to serve as a",
            "reward (`clip`) in toy RL runs. Load it with",
            '`load_reward("clip", model="local-dir:assets/models/toy-clip", pretrained=None)`',
            '(add `convention="cosine"` for the raw cosine).',
            "",
            "Training: symmetric InfoNCE over all 400 train captions with every caption true of a scene as",
            "a positive, plus NegCLIP-style hard negatives (the same scene with one colour, count, shape or",
            "relation changed); augmented renders (colour jitter, blur, noise, JPEG, down-up, 48 px).",
            "Weights are stored in float16 (open_clip hub layout).",
        ]
    else:
        lines += [
            "A LLaVA-style VLM (CLIP vision tower, Qwen2 LM) trained on the toy shape world",
            '(genalign issue #6) to serve as a judge: `load_reward("vlm_yes", model="assets/models/toy-vlm")`',
            '(VQAScore), `mode="comparative"` (RewardDance) and `load_reward("iqa", model=..., preset="qalign")`.',
            "",
            "Training: next-token cross-entropy on the answer token of (a) VQAScore yes/no questions (true,",
            "one-attribute-changed and random captions), (b) RewardDance comparisons (prompt match, less",
            "degraded) and (c) Q-Align ratings of renders degraded by blur/noise/JPEG/downsampling at",
            "severities 0-4 (excellent ... bad).",
        ]
        if recipe.vision_init:
            frozen = "frozen" if recipe.vision_lr_scale == 0 else f"lr x{recipe.vision_lr_scale:g}"
            lines += [
                f"The vision tower starts from toy-clip's image encoder ({recipe.vision_init}, {frozen}); the",
                "projector and the LM are trained from scratch.",
            ]
        if recipe.question_weight > 0:
            lines += [
                f"Plus (weight {recipe.question_weight:g}) a next-token loss on the question of every true yes/no",
                "chat: the quoted caption predicted from the image. Without it the answer token stayed at its",
                "prior; see `VlmRecipe.question_weight`.",
            ]
        if recipe.caption_weight > 0:
            lines += [
                f"Plus (weight {recipe.caption_weight:g}) LLaVA's captioning task on every caption token."
            ]
    lines += [
        "",
        "Data: scenes of `genalign.toy.train_prompts()` only; held-out prompts are never seen.",
        "",
        "## Recipe",
        "",
        *(f"    {line}" for line in command.splitlines()),
        "",
        f"Parameters: {training['parameters']:,}; size on disk {card['size_mb']} MB; training time "
        f"{training['seconds'] / 60:.1f} min ({training['steps']} steps) on one CPU thread of a shared, loaded machine; loss "
        f"{training['first_loss']:.3f} (first 50 steps) -> {training['final_loss']:.3f} (last 50).",
        "",
        "## Scores (held-out prompts)",
        "",
        f'Measured by `evaluate_reward_model("{name}", <folder>)` on `heldout_eval_set()`: {EVAL_PER_CATEGORY} cases per',
        "held-out category (seed {EVAL_SEED}, cairosvg 64 px); 'noisy' = blur 0.8 px + noise 0.03.".replace(
            "{EVAL_SEED}", str(EVAL_SEED)
        ),
        "",
        _EVAL_NOTES[name],
        "",
        "| metric | value |",
        "|---|---|",
    ]
    for key, value in scores.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {_fmt(key, v)}" for k, v in value.items())
        else:
            value = _fmt(key, value)
        lines.append(f"| {key} | {value} |")
    lines += [
        "",
        f"Subset scores (cases {subset_indices()}; tests reproduce them within 2e-3): "
        + ", ".join(f"{k} {v:.4f}" for k, v in subset.items()),
        "",
    ]
    (folder / "README.md").write_text("\n".join(lines), encoding="utf-8")


# -- command line -------------------------------------------------------------------------------------------------


def continued_record(
    previous: dict[str, Any], command: str, training: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The card record of a run continued from a model whose card is ``previous``: every stage's
    command (one per line, first to last), the steps and seconds of all stages, the first stage's
    first loss and this stage's final loss."""
    before = previous["training"]
    total = dict(training, first_loss=before["first_loss"])
    for key in ("seconds", "steps"):
        total[key] = training[key] + before[key]
    return f"{previous['command']}\n{command}", total


# the command-line options that set VlmRecipe fields of the same name
VLM_OPTIONS = (
    "init",
    "lr",
    "vision_init",
    "vision_lr_scale",
    "caption_weight",
    "vision_feature_layer",
    "task_mix",
    "question_weight",
    "scenes_per_prompt",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train a toy-world reward model and write its card.")
    parser.add_argument("model", choices=MODEL_NAMES)
    parser.add_argument("--out", required=True, help="output folder (e.g. assets/models/toy-clip)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="override the recipe's step count")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--max-minutes", type=float, default=None, help="wall-clock budget of the training loop"
    )
    parser.add_argument(
        "--evaluate-only", action="store_true", help="re-evaluate a trained folder and rewrite its card"
    )
    parser.add_argument(
        "--init", help="toy-vlm: a trained toy-vlm folder to continue training from (same options)"
    )
    parser.add_argument("--lr", type=float, help="toy-vlm: the peak learning rate")
    parser.add_argument(
        "--vision-init", help="toy-vlm: a toy-clip folder whose image tower starts the vision tower"
    )
    parser.add_argument(
        "--vision-lr-scale", type=float, help="toy-vlm: the vision tower's lr relative to the rest"
    )
    parser.add_argument(
        "--caption-weight", type=float, help="toy-vlm: weight of the captioning (feature-alignment) loss"
    )
    parser.add_argument(
        "--question-weight",
        type=float,
        help="toy-vlm: weight of the next-token loss on the questions of true yes/no chats",
    )
    parser.add_argument(
        "--scenes-per-prompt",
        type=int,
        help="toy-vlm: random scenes rendered per train prompt (the training bank's size)",
    )
    parser.add_argument(
        "--vision-feature-layer", type=int, help="toy-vlm: the vision layer the projector reads"
    )
    parser.add_argument(
        "--task-mix",
        type=float,
        nargs=3,
        metavar=("YES_NO", "COMPARATIVE", "RATING"),
        help="toy-vlm: the three tasks' shares of a batch",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    command = f"python -m genalign.toy.reward_models {args.model} --out {args.out} --seed {args.seed}"
    if args.steps is not None:
        command += f" --steps {args.steps}"
    if args.max_minutes is not None:
        command += f" --max-minutes {args.max_minutes:g}"
    vlm_options = {}
    for name in VLM_OPTIONS:  # in the order the recorded commands list them
        value = getattr(args, name)
        if value is None:
            continue
        vlm_options[name] = tuple(value) if isinstance(value, list) else value
        shown = " ".join(f"{v:g}" for v in value) if isinstance(value, list) else value
        shown = f"{shown:g}" if isinstance(shown, float) else shown
        command += f" --{name.replace('_', '-')} {shown}"
    if vlm_options and args.model != "toy-vlm":
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in VLM_OPTIONS)
        parser.error(f"{flags} apply to toy-vlm only")
    recipe_type = ClipRecipe if args.model == "toy-clip" else VlmRecipe
    if args.evaluate_only:
        card = json.loads((out / "card.json").read_text(encoding="utf-8"))
        recipe = recipe_type(**{k: tuple(v) if isinstance(v, list) else v for k, v in card["recipe"].items()})
        training, command = card["training"], card["command"]
    else:
        recipe = recipe_type(seed=args.seed)
        recipe = replace(recipe, steps=args.steps) if args.steps is not None else recipe
        recipe = replace(recipe, max_minutes=args.max_minutes, **vlm_options)
        if args.model == "toy-clip":
            model, training = train_clip(recipe)
            save_clip(model, recipe, out)
        else:
            model, processor, training = train_vlm(recipe)
            save_vlm(model, processor, out)
        training = {
            "parameters": training["parameters"],
            "seconds": training["seconds"],
            "steps": training["steps"],
            "final_loss": float(np.mean(training["losses"][-50:])),
            "first_loss": float(np.mean(training["losses"][:50])),
        }
        if recipe.init is not None:  # a continued run: its card covers every stage
            previous = json.loads((Path(recipe.init) / "card.json").read_text(encoding="utf-8"))
            command, training = continued_record(previous, command, training)
        # the recipe and training record first, so a failed evaluation can be rerun (--evaluate-only)
        (out / "card.json").write_text(
            json.dumps({"command": command, "recipe": asdict(recipe), "training": training}, indent=2) + "\n",
            encoding="utf-8",
        )
    scores = evaluate_reward_model(args.model, out)
    subset = subset_scores(args.model, out)
    write_card(args.model, out, recipe, training, scores, subset, command)
    print(json.dumps({"scores": scores, "subset": subset}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
