"""DiffusionNFT's loss kernel and old-policy schedule (Zheng et al. 2025, arXiv:2509.16117).

Pure tensor math; the trainer integration (old policy, noise, guidance, the policy's forward
process) is :mod:`genalign.trainers.losses.nft`. With x_0 a sample, eps ~ N(0, I), t in (0, 1],
x_t = (1 - t) x_0 + t eps and v* = eps - x_0, the positive and the implicit negative policy are
(Sec. 3.2, eq. 7)

    v+(x_t) = (1 - beta) v_old(x_t) + beta v_theta(x_t)
    v-(x_t) = (1 + beta) v_old(x_t) - beta v_theta(x_t)

and the loss weighs the two by the optimality probability r in [0, 1] of each sample (eq. 8):

    L = r ||v+ - v*||^2 + (1 - r) ||v- - v*||^2,      r = clip(A, -c, c) / (2c) + 1/2

Adaptive weighting (Sec. 4 and the official code): each squared error is taken in x0-prediction
space and divided by its own stop-gradient mean absolute error; the loss is multiplied by c / beta
(``clip_over_beta``; Astrolabe's trainer, :mod:`.astrolabe`, turns both off).
The old policy's soft update theta_old <- eta_i theta_old + (1 - eta_i) theta uses
eta_i = min(rate * max(i - flat, 0), max) after i optimiser steps (Sec. 4, "soft update"; the
official code's ``return_decay`` with ``decay_type=1``).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["nft_loss", "nft_loss_in_x0", "nft_old_policy_decay", "optimality_probability"]


def optimality_probability(advantages: torch.Tensor, advantage_clip: float) -> torch.Tensor:
    """r = clip(A, -c, c) / (2c) + 1/2, in [0, 1] (DiffusionNFT eq. 8)."""
    if advantage_clip <= 0:
        raise ValueError(f"advantage_clip must be positive, got {advantage_clip}")
    return advantages.clamp(-advantage_clip, advantage_clip) / (2 * advantage_clip) + 0.5


def nft_old_policy_decay(
    optimizer_steps: int, rate: float = 0.001, maximum: float = 0.5, flat: int = 0
) -> float:
    """eta_i of the old policy's soft update: 0 for i < flat, then min(rate * (i - flat), maximum)."""
    if optimizer_steps < flat:
        return 0.0
    return min(rate * (optimizer_steps - flat), maximum)


def nft_loss(
    v_theta: torch.Tensor,
    v_old: torch.Tensor,
    x0: torch.Tensor,
    x_t: torch.Tensor,
    t: torch.Tensor,
    advantages: torch.Tensor,
    **options: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-sample DiffusionNFT loss ``[B]`` for a rectified flow (eq. 8 with the official adaptive
    weighting and c / beta): :func:`nft_loss_in_x0` with the velocity parameterisation.

    Args:
        v_theta: ``[B, ...]`` velocity of the trained policy at (x_t, t) (with gradients).
        v_old: ``[B, ...]`` velocity of the old policy (no gradients needed; detached here).
        x0: ``[B, ...]`` clean samples; x_t: ``[B, ...]`` = (1 - t) x0 + t eps.
        t: ``[B]`` noise levels in (0, 1].
        advantages: ``[B]`` group advantages.
        **options: ``beta`` (1.0), ``advantage_clip`` (5.0), ``adaptive_weighting`` (True: divide
            each x0-space squared error by its stop-gradient mean absolute error, the official
            code; False gives the plain velocity losses of eq. 8), ``weight_min`` (1e-5) and
            ``clip_over_beta`` (True), as :func:`nft_loss_in_x0` takes them.
    """
    t_b = t.reshape(-1, *([1] * (x0.ndim - 1))).to(x0.dtype)
    v_old = v_old.detach()
    return nft_loss_in_x0(
        v_theta,
        v_old,
        (x_t - x0) / t_b,  # v* = eps - x0
        x_t - t_b * v_theta,
        x_t - t_b * v_old,
        x0,
        advantages,
        **options,
    )


def nft_loss_in_x0(
    out_theta: torch.Tensor,
    out_old: torch.Tensor,
    target: torch.Tensor,
    x0_theta: torch.Tensor,
    x0_old: torch.Tensor,
    x0: torch.Tensor,
    advantages: torch.Tensor,
    beta: float = 1.0,
    advantage_clip: float = 5.0,
    adaptive_weighting: bool = True,
    weight_min: float = 1e-5,
    clip_over_beta: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-sample DiffusionNFT loss ``[B]`` in any parameterisation (module docstring).

    ``out_theta`` / ``out_old``: the trained and the old denoiser's outputs at x_t; ``target``:
    what the denoiser regresses there; ``x0_theta`` / ``x0_old``: the one-step x0 predictions
    those outputs imply, which must be affine in the output (true of every diffusion and flow
    parameterisation), so that the implicit policies' predictions are the same mixtures (eq. 7).
    ``clip_over_beta`` multiplies the loss by ``advantage_clip / beta`` (the official NFT code).
    """
    if beta <= 0:
        raise ValueError(f"beta must be positive, got {beta}")
    out_old, x0_old = out_old.detach(), x0_old.detach()
    dims = tuple(range(1, x0.ndim))
    r = optimality_probability(advantages.to(x0.dtype), advantage_clip)
    if adaptive_weighting:
        x0_positive = beta * x0_theta + (1 - beta) * x0_old  # eq. 7, mapped to x0
        x0_negative = (1 + beta) * x0_old - beta * x0_theta
        with torch.no_grad():
            w_positive = (x0_positive.double() - x0.double()).abs().mean(dims).clamp(min=weight_min)
            w_negative = (x0_negative.double() - x0.double()).abs().mean(dims).clamp(min=weight_min)
        positive = ((x0_positive - x0) ** 2).mean(dims) / w_positive.to(x0.dtype)
        negative = ((x0_negative - x0) ** 2).mean(dims) / w_negative.to(x0.dtype)
    else:
        out_positive = beta * out_theta + (1 - beta) * out_old  # eq. 7
        out_negative = (1 + beta) * out_old - beta * out_theta
        positive = ((out_positive - target) ** 2).mean(dims)
        negative = ((out_negative - target) ** 2).mean(dims)
    loss = r * positive + (1 - r) * negative
    if clip_over_beta:
        loss = loss * (advantage_clip / beta)
    info = {
        "nft_positive_loss": positive.detach().mean(),
        "nft_negative_loss": negative.detach().mean(),
        "nft_r": r.detach().mean(),
        "nft_old_deviation": ((out_theta.detach() - out_old) ** 2).mean(),
    }
    return loss, info
