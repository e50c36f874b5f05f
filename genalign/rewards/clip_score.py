"""CLIPScore: image-text agreement under a CLIP model.

Hessel et al., "CLIPScore: A Reference-free Evaluation Metric for Image Captioning", EMNLP 2021,
Eq. 1::

    CLIP-S(c, v) = w * max(cos(c, v), 0),   w = 2.5

with c the text embedding of the caption (the paper prefixes "A photo depicts") and v the image
embedding of OpenAI's CLIP ViT-B/32. Here any open_clip or transformers CLIP model can be used.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from genalign.rewards.base import RewardOutput, register_reward
from genalign.rewards.clip_models import CLIPBackendReward

CONVENTIONS = ("clipscore", "cosine", "logit")
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
class CLIPScoreReward(CLIPBackendReward):
    """CLIPScore (Hessel et al. 2021) or raw CLIP cosine between each image and its prompt.

    Args:
        backend: "open_clip" or "transformers".
        model: the CLIP model (see :class:`~genalign.rewards.clip_models.CLIPBackendReward`);
            default: the paper's ViT-B/32 (``"ViT-B-32"`` / ``"openai/clip-vit-base-patch32"``).
        convention: "clipscore" -> ``w * max(cos, 0)`` in [0, w]; "cosine" -> cos in [-1, 1];
            "logit" -> ``exp(logit_scale) * cos``, CLIP's own logit (100 cos for models whose
            temperature reached OpenAI's cap; ReNO's CLIP reward, ``rewards/clip.py``).
        w: CLIPScore's rescaling weight (2.5 in the paper).
        prefix: text put before every prompt; the paper uses "A photo depicts" (``PAPER_PREFIX``).
        pretrained, model_config, processor, device, dtype, strict, **backend_kwargs: as
            :class:`~genalign.rewards.clip_models.CLIPBackendReward` takes them.

    Scores: ``[B]``; range [0, w] (typically 0.5-1.0 for w = 2.5 with ViT-B/32), [-1, 1] or
    [-100, 100] (the logit).
    Differentiable w.r.t. the images (the ``max(., 0)`` clamp has zero gradient below 0).
    """

    default_models = DEFAULT_MODELS

    def __init__(
        self,
        backend: str = "open_clip",
        model: str | os.PathLike | torch.nn.Module | None = None,
        convention: str = "clipscore",
        w: float = 2.5,
        prefix: str | None = None,
        **embedder_options: Any,
    ) -> None:
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
        super().__init__(backend, model, **embedder_options)
        self.convention = convention
        self.w = float(w)
        self.prefix = prefix

    def score(self, images: torch.Tensor, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        cosine = self.embedder.cosine(images, add_prefix(prompts, self.prefix))  # (B,)
        if self.convention == "cosine":
            return RewardOutput(cosine, {})
        if self.convention == "logit":
            return RewardOutput(
                self.embedder.logit_scale().to(cosine.device) * cosine, {"cosine": cosine.detach()}
            )
        # Hessel et al. 2021, Eq. 1: w * max(cos, 0)
        return RewardOutput(self.w * cosine.clamp(min=0.0), {"cosine": cosine.detach()})

    def extra_repr(self) -> str:
        return f"convention={self.convention!r}, w={self.w}, prefix={self.prefix!r}"


# Deprecated aliases: class names spell acronyms in upper case (#22); the old names keep working.
ClipScoreReward = CLIPScoreReward
