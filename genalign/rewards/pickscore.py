"""PickScore: a CLIP-H fine-tuned on human preferences between generated images.

Kirstain et al., "Pick-a-Pic: An Open Dataset of User Preferences for Text-to-Image Generation",
NeurIPS 2023. Model ``yuvalkirstain/PickScore_v1`` (a transformers ``CLIPModel``, ViT-H/14), used
with the processor of ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K`` (224 px, bicubic shortest-edge
resize, centre crop, OpenAI CLIP mean/std). The score is the CLIP logit::

    s(x, p) = exp(logit_scale) * cos(E_img(x), E_txt(p))

and the preference probability among candidates x_1..x_K for one prompt is softmax_k s(x_k, p)
(the Bradley-Terry / InfoNCE objective it was trained with).
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from genalign.rewards.base import Reward, RewardOutput, register_reward
from genalign.rewards.clip_models import TransformersCLIPEmbedder

PICKSCORE_MODEL = "yuvalkirstain/PickScore_v1"
PICKSCORE_PROCESSOR = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"


def group_softmax(scores: torch.Tensor, groups: Sequence[Hashable]) -> torch.Tensor:
    """Softmax of ``scores [B]`` within each group of equal ``groups[i]``; ``[B]``, sums to 1 per group."""
    labels: dict[Hashable, int] = {}
    index = torch.tensor([labels.setdefault(g, len(labels)) for g in groups], device=scores.device)
    probs = torch.empty_like(scores)
    for label in range(len(labels)):
        members = (index == label).nonzero().flatten()
        probs = probs.index_put((members,), torch.softmax(scores[members], dim=0))
    return probs


@register_reward("pickscore")
class PickScoreReward(Reward):
    """PickScore v1 (Kirstain et al. 2023) of each image for its prompt.

    Args:
        model: hub id or folder of the PickScore ``CLIPModel``.
        processor: hub id or folder of its processor (the LAION CLIP-H one).
        softmax: return each image's preference probability among the images of its group
            instead of the raw score. Groups are given by ``group_ids`` metadata (one hashable per
            image), or else images with identical prompts form a group.
        device, dtype: where and in which precision the model runs.
        strict: raise on NaN scores.

    Scores ``[B]``: raw in [-exp(logit_scale), exp(logit_scale)] (PickScore_v1: scale 100,
    typical scores 18-24); with ``softmax`` in [0, 1], summing to 1 per group.
    ``details["pickscore"]`` always holds the raw scores. Differentiable w.r.t. the images.
    """

    differentiable = True

    def __init__(
        self,
        model: str | os.PathLike | torch.nn.Module = PICKSCORE_MODEL,
        processor: str | os.PathLike | Any = PICKSCORE_PROCESSOR,
        softmax: bool = False,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        self.embedder = TransformersCLIPEmbedder(model=model, processor=processor, device=device, dtype=dtype)
        self.softmax = softmax

    def score(self, images: torch.Tensor, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        scores = self.embedder.logit_scale() * self.embedder.cosine(images, prompts)  # (B,)
        details: dict[str, Any] = {"pickscore": scores.detach()}
        if not self.softmax:
            return RewardOutput(scores, details)
        groups = metadata.get("group_ids")
        if groups is None:
            groups = list(prompts)
        elif torch.is_tensor(groups):
            groups = groups.tolist()
        if len(groups) != len(prompts):
            raise ValueError(f"pickscore: got {len(groups)} group_ids for {len(prompts)} images")
        return RewardOutput(group_softmax(scores, groups), details)

    def extra_repr(self) -> str:
        return f"softmax={self.softmax}"
