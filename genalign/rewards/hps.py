"""Human Preference Score v2 / v2.1 on open_clip ViT-H/14, without the ``hpsv2`` package.

Wu et al., "Human Preference Score v2: A Solid Benchmark for Evaluating Human Preferences of
Text-to-Image Synthesis", 2023. HPS v2 fine-tunes open_clip ViT-H-14 (laion2B-s32B-b79K) on the
HPD v2 preference pairs; v2.1 is a later checkpoint trained on more data. The score is the cosine
of the normalised image and text features (the official ``img_score.py`` takes the diagonal of
``image_features @ text_features.T`` with both normalised)::

    HPS(x, p) = <E_img(x) / |E_img(x)|, E_txt(p) / |E_txt(p)|>

The official checkpoints (hub repo ``xswu/HPSv2``: ``HPS_v2_compressed.pt``,
``HPS_v2.1_compressed.pt``) are ``{"state_dict": <open_clip keys>}``; a bare state dict and
``.safetensors`` load too. They hold the whole model, so no LAION weights are downloaded first.

Preprocessing is HPS's own, not open_clip's default: ``img_score.py`` builds the model with
``light_augmentation=True``, whose eval transform is ``resize_longest_max=True`` (HPS's
``ResizeMaxSize``): the longest side is resized to 224 (bicubic, aspect kept) and the rest padded
with black, nothing cropped. It resizes the float tensor (``ToTensor`` comes first), so bicubic
overshoot is not clamped as a PIL image's would be; antialiased, as torchvision >= 0.17 resizes a
tensor by default (older torchvision did not antialias tensors).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from genalign.rewards.base import Reward, RewardOutput, register_reward
from genalign.rewards.checkpoints import resolve_checkpoint
from genalign.rewards.clip_models import OpenCLIPEmbedder

HPS_REPO = "xswu/HPSv2"
HPS_CHECKPOINTS = {"v2.0": "HPS_v2_compressed.pt", "v2.1": "HPS_v2.1_compressed.pt"}


@register_reward("hpsv2")
class HPSv2Reward(Reward):
    """HPS v2 / v2.1 (Wu et al. 2023) of each image for its prompt.

    Args:
        version: "v2.0" or "v2.1": which official checkpoint to fetch when ``checkpoint`` is None.
        checkpoint: local checkpoint file (``.pt``/``.pth``/``.bin`` with or without the
            ``"state_dict"`` wrapper, or ``.safetensors``); None downloads the official one.
        model: open_clip architecture of the checkpoint (``"ViT-H-14"``).
        model_config: custom open_clip architecture (dict or JSON path) registered as ``model``.
        hub_repo: hub repo of the official checkpoints.
        device, dtype: where and in which precision the model runs (HPS ran in fp16 autocast).
        strict: raise on NaN scores.

    Scores ``[B]`` in [-1, 1]; on real generations typically 0.2-0.35. Differentiable.
    """

    differentiable = True

    def __init__(
        self,
        version: str = "v2.1",
        checkpoint: str | os.PathLike | None = None,
        model: str = "ViT-H-14",
        model_config: Mapping[str, Any] | str | os.PathLike | None = None,
        hub_repo: str = HPS_REPO,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        if version not in HPS_CHECKPOINTS:
            raise ValueError(f"hpsv2: version must be one of {sorted(HPS_CHECKPOINTS)}, got {version!r}")
        path = resolve_checkpoint(
            checkpoint, repo_id=hub_repo, filename=HPS_CHECKPOINTS[version], what="HPS checkpoint"
        )
        # open_clip's loader unwraps {"state_dict": ...}, strips "module." and reads safetensors.
        self.embedder = OpenCLIPEmbedder(
            model=model, pretrained=path, model_config=model_config, device=device, dtype=dtype
        )
        # HPS's eval transform: fit the longest side, pad with black (module docstring)
        preprocess = self.embedder.preprocess
        preprocess.config = dataclasses.replace(
            preprocess.config, resize_mode="longest", fill=0.0, resampling="tensor"
        )
        self.version = version

    def score(self, images: torch.Tensor, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        return RewardOutput(self.embedder.cosine(images, prompts), {})

    def extra_repr(self) -> str:
        return f"version={self.version!r}"
