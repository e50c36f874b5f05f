"""Reward-weighted regression weights (DDPO's RWR baselines, Black et al. 2023, after Lee et al.
2023 and Peters & Schaal 2007): ``w_RWR = exp(beta * A)`` or ``w_sparse = 1[A >= C]``, with A the
sample's advantage. The loss is :mod:`genalign.trainers.losses.rwr`."""

from __future__ import annotations

import torch

__all__ = ["rwr_weights"]


def rwr_weights(
    advantages: torch.Tensor, weighting: str = "exp", beta: float = 1.0, threshold: float = 0.0
) -> torch.Tensor:
    """Per-sample RWR weights (DDPO's RWR baselines): ``exp(beta * A)`` or ``1[A >= threshold]``."""
    if weighting == "exp":
        return torch.exp(beta * advantages)
    if weighting == "sparse":
        return (advantages >= threshold).to(advantages.dtype)
    raise ValueError(f"unknown RWR weighting {weighting!r}: use 'exp' or 'sparse'")
