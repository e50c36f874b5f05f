"""LAION improved aesthetic predictor: an MLP on L2-normalised CLIP ViT-L/14 image embeddings.

Schuhmann, "CLIP+MLP Aesthetic Score Predictor" (github.com/christophschuhmann/
improved-aesthetic-predictor, 2022), trained on SAC + LAION-Logos + AVA ratings (1-10 scale); the
reward of DDPO (Black et al., "Training Diffusion Models with Reinforcement Learning", 2023) for
aesthetic quality. The head is linear: the official ``MLP`` has its ReLUs commented out::

    layers = Sequential(Linear(768, 1024), Dropout(0.2), Linear(1024, 128), Dropout(0.2),
                        Linear(128, 64), Dropout(0.1), Linear(64, 16), Linear(16, 1))
    score = layers(e / |e|),   e = CLIP ViT-L/14 image embedding (768-d)

Checkpoint keys are ``layers.{0,2,4,6,7}.{weight,bias}`` (``sac+logos+ava1-l14-linearMSE.pth``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from genalign.rewards.base import RewardOutput, register_reward
from genalign.rewards.checkpoints import load_state_dict_file, resolve_checkpoint
from genalign.rewards.clip_models import CLIPBackendReward

AESTHETIC_REPO = "camenduru/improved-aesthetic-predictor"
AESTHETIC_CHECKPOINT = "sac+logos+ava1-l14-linearMSE.pth"
DEFAULT_MODELS = {"transformers": "openai/clip-vit-large-patch14", "open_clip": "ViT-L-14"}


class AestheticMLP(nn.Module):
    """The official predictor head; ``forward``: ``[B, input_size]`` embeddings -> ``[B, 1]``."""

    def __init__(self, input_size: int = 768) -> None:
        super().__init__()
        self.input_size = input_size
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self.layers(embeddings)

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike) -> AestheticMLP:
        """Load the official key layout from ``.pth`` (``weights_only``) or ``.safetensors``."""
        state = load_state_dict_file(path, "aesthetic predictor checkpoint")
        if "layers.0.weight" not in state:
            raise ValueError(
                f"{path}: not an aesthetic predictor checkpoint (no 'layers.0.weight'; keys {sorted(state)[:5]})"
            )
        head = cls(input_size=state["layers.0.weight"].shape[1])
        head.load_state_dict(state, strict=True)
        return head


@register_reward("aesthetic")
class AestheticReward(CLIPBackendReward):
    """LAION aesthetic score (improved-aesthetic-predictor, as in DDPO) of each image.

    Args:
        checkpoint: the MLP head file (``.pth`` or ``.safetensors``); None downloads
            ``sac+logos+ava1-l14-linearMSE.pth`` from ``hub_repo``.
        backend: CLIP backend, "transformers" (DDPO's ``openai/clip-vit-large-patch14``) or
            "open_clip" (``("ViT-L-14", "openai")``, the official ``clip`` package's weights).
        model: CLIP model (hub id / folder / open_clip name); default: ViT-L/14 of the backend.
        pretrained, model_config: open_clip tag or checkpoint file, custom architecture.
        processor: transformers processor (default: ``model``).
        device, dtype: where and in which precision the models run.
        strict: raise on NaN scores.

    Scores ``[B]``: the predicted mean rating on a 1-10 scale (unbounded linear head;
    Stable Diffusion samples typically score 4.5-7). Prompts are ignored. Differentiable w.r.t. the images.
    """

    default_models = DEFAULT_MODELS

    def __init__(
        self,
        checkpoint: str | os.PathLike | None = None,
        backend: str = "transformers",
        model: str | os.PathLike | torch.nn.Module | None = None,
        pretrained: str | os.PathLike | None = "openai",
        model_config: Mapping[str, Any] | str | os.PathLike | None = None,
        processor: str | os.PathLike | Any = None,
        hub_repo: str = AESTHETIC_REPO,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        strict: bool = False,
    ) -> None:
        path = resolve_checkpoint(
            checkpoint, repo_id=hub_repo, filename=AESTHETIC_CHECKPOINT, what="aesthetic predictor checkpoint"
        )
        head = AestheticMLP.from_checkpoint(path)
        super().__init__(backend, model, pretrained, model_config, processor, device, dtype, strict)
        if self.embedder.embed_dim not in (None, head.input_size):
            raise ValueError(
                f"aesthetic: the CLIP model gives {self.embedder.embed_dim}-d image embeddings but the head "
                f"{path} expects {head.input_size}-d (CLIP ViT-L/14 gives 768)"
            )
        self.head = head.eval().requires_grad_(False).to(device=self.embedder.device)

    def score(self, images: torch.Tensor, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        # the official predictor L2-normalises the CLIP embedding before the linear head
        embeddings = nn.functional.normalize(self.embedder.encode_images(images), dim=-1)  # (B, D)
        head_dtype = self.head.layers[0].weight.dtype
        return RewardOutput(self.head(embeddings.to(head_dtype)).squeeze(-1).float(), {})
