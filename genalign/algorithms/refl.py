"""The ReFL objective on rewards (Xu et al. 2023, ImageReward, the ReFL section and Algorithm 1):
``-scale * mean(r)`` or the official code's hinge ``grad_scale * ReLU(margin - r)``. The loss that
produces the rewards through a one-step x0 prediction is :mod:`genalign.trainers.losses.refl`."""

from __future__ import annotations

import torch

__all__ = ["refl_objective"]


def refl_objective(
    scores: torch.Tensor, objective: str = "linear", scale: float = 1.0, margin: float = 2.0
) -> torch.Tensor:
    """The ReFL loss of rewards ``scores`` ``[N]``: ``-scale * mean(r)`` (``"linear"``) or
    ImageReward's ``scale * mean(ReLU(margin - r))`` (``"relu"``)."""
    if objective == "linear":
        return -scale * scores.mean()
    if objective == "relu":
        return scale * torch.relu(margin - scores).mean()
    raise ValueError(f"objective must be 'linear' or 'relu', got {objective!r}")
