"""CLIPScore: image-text agreement under a CLIP model.

Hessel et al., "CLIPScore: A Reference-free Evaluation Metric for Image Captioning", EMNLP 2021,
Eq. 1::

    CLIP-S(c, v) = w * max(cos(c, v), 0),   w = 2.5

with c the text embedding of the caption (the paper prefixes "A photo depicts") and v the image
embedding of OpenAI's CLIP ViT-B/32. Here any open_clip or transformers CLIP model can be used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from genalign.rewards.base import Reward, RewardOutput, register_reward
from genalign.rewards.clip_models import load_backend_embedder

CONVENTIONS = ("clipscore", "cosine")
PAPER_PREFIX = "A photo depicts"
DEFAULT_MODELS = {"open_clip": "ViT-B-32", "transformers": "openai/clip-vit-base-patch32"}


def add_prefix(prompts: Sequence[str], prefix: str | None) -> list[str]:
    """``prefix + " " + prompt`` (CLIPScore's caption template); unchanged when prefix is None/empty."""
    if not prefix:
        return list(prompts)
    if not prefix.endswith(" "):
        prefix += " "
    return [prefix + prompt for prompt in prompts]


@register_reward("clip")
class ClipScoreReward(Reward):
    """CLIPScore (Hessel et al. 2021) or raw CLIP cosine between each image and its prompt.

    Args:
        backend: "open_clip" or "transformers".
        model: open_clip architecture name (``"ViT-B-32"``, ``"hf-hub:..."``, ``"local-dir:..."``)
            or a transformers ``CLIPModel`` hub id / folder; default: the paper's ViT-B/32
            (``"ViT-B-32"`` / ``"openai/clip-vit-base-patch32"``).
        pretrained: open_clip tag (``"openai"``) or checkpoint file (open_clip backend only).
        model_config: custom open_clip architecture (dict or JSON path), registered as ``model``.
        processor: transformers processor hub id / folder (default: ``model``).
        convention: "clipscore" -> ``w * max(cos, 0)`` in [0, w]; "cosine" -> cos in [-1, 1].
        w: CLIPScore's rescaling weight (2.5 in the paper).
        prefix: text put before every prompt; the paper uses "A photo depicts" (``PAPER_PREFIX``).
        device, dtype: where and in which precision the CLIP model runs.
        strict: raise on NaN scores.

    Scores: ``[B]``; range [0, w] (typically 0.5-1.0 for w = 2.5 with ViT-B/32) or [-1, 1].
    Differentiable w.r.t. the images (the ``max(., 0)`` clamp has zero gradient below 0).
    """

    differentiable = True

    def __init__(
        self,
        backend: str = "open_clip",
        model: str | os.PathLike | torch.nn.Module | None = None,
        pretrained: str | os.PathLike | None = "openai",
        model_config: Mapping[str, Any] | str | os.PathLike | None = None,
        processor: str | os.PathLike | Any = None,
        convention: str = "clipscore",
        w: float = 2.5,
        prefix: str | None = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        strict: bool = False,
        **backend_kwargs: Any,
    ) -> None:
        super().__init__(strict=strict)
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
        if model is None:
            model = DEFAULT_MODELS.get(backend, "ViT-B-32")
        self.embedder = load_backend_embedder(
            backend, model, pretrained, model_config, processor, device=device, dtype=dtype, **backend_kwargs
        )
        self.convention = convention
        self.w = float(w)
        self.prefix = prefix

    def score(self, images: torch.Tensor, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        cosine = self.embedder.cosine(images, add_prefix(prompts, self.prefix))  # (B,)
        if self.convention == "cosine":
            return RewardOutput(cosine, {})
        # Hessel et al. 2021, Eq. 1: w * max(cos, 0)
        return RewardOutput(self.w * cosine.clamp(min=0.0), {"cosine": cosine.detach()})

    def extra_repr(self) -> str:
        return f"convention={self.convention!r}, w={self.w}, prefix={self.prefix!r}"
