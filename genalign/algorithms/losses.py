"""Policy-gradient losses on per-step log-probabilities: PPO-clip (DDPO-IS, GRPO) and score function.

A denoising step is a Gaussian policy ``p_theta(x_{t-1} | x_t, c)`` over a latent with ``D``
elements; the step kernels in :mod:`genalign.sampling` return its exact log-density summed over
those ``D`` elements. Two conventions for the importance ratio exist:

* ``ratio_reduction="sum"``: the exact ratio ``p_theta / p_old = exp(log_prob_new - log_prob_old)``
  (PPO, Schulman et al. 2017, eq. 6).
* ``ratio_reduction="mean"``: DDPO's and Flow-GRPO's released code averages the log-density over
  latent elements instead of summing it, so their ratio is ``exp((log_prob_new - log_prob_old) / D)``
  — the geometric mean of the per-element ratios, ``(p_theta / p_old) ** (1 / D)``. The exact
  ratio moves by orders of magnitude for a small change in a 16k-element latent, so the
  published ``clip_range`` values (1e-4 in DDPO, 1e-4 to 2e-4 in Flow-GRPO) and learning rates
  only carry over under this convention. Pass ``num_dims = D`` (elements per sample).

The choice is a loss option, not a kernel convention (DESIGN.md).
"""

from __future__ import annotations

from typing import Literal

import torch

RatioReduction = Literal["sum", "mean"]

__all__ = ["NO_CLIP", "clip_bounds", "ppo_clip_loss", "reduce_log_prob", "score_function_loss"]


def reduce_log_prob(
    log_prob: torch.Tensor, ratio_reduction: RatioReduction = "sum", num_dims: int | None = None
) -> torch.Tensor:
    """Express summed log-densities ``[B]`` in the units a loss works in.

    ``"sum"`` returns ``log_prob`` unchanged; ``"mean"`` divides it by ``num_dims`` (the number of
    latent elements per sample), giving the per-element average DDPO and Flow-GRPO use.
    """
    if ratio_reduction == "sum":
        return log_prob
    if ratio_reduction == "mean":
        if num_dims is None or num_dims < 1:
            raise ValueError(
                f"ratio_reduction='mean' needs num_dims (latent elements per sample) >= 1, got {num_dims}"
            )
        return log_prob / num_dims
    raise ValueError(f"ratio_reduction must be 'sum' or 'mean', got {ratio_reduction!r}")


def _check_shapes(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 1 or any(shape != first for shape in shapes.values()):
        described = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
        raise ValueError(f"expected matching shapes [B]; got {described}")


# the clip range that clips nothing: [1 - 1, 1 + inf] holds every ratio exp(.) > 0
NO_CLIP = (1.0, float("inf"))


def clip_bounds(clip_range: float | tuple[float, float]) -> tuple[float, float]:
    """``(eps_low, eps_high)`` of a symmetric ``eps`` or an asymmetric pair, checked:
    ``0 <= eps_low <= 1`` and ``eps_high >= 0`` (the ratio is clipped to ``[1 - eps_low, 1 + eps_high]``;
    ``(1, inf)`` leaves every ratio, which is > 0, unclipped: :data:`NO_CLIP`)."""
    low, high = (clip_range, clip_range) if isinstance(clip_range, (int, float)) else clip_range
    if not (0 <= low <= 1 and high >= 0):
        raise ValueError(f"clip_range must satisfy 0 <= eps_low <= 1 and eps_high >= 0, got {clip_range}")
    return low, high


def ppo_clip_loss(
    log_prob_new: torch.Tensor,
    log_prob_old: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float | tuple[float, float],
    ratio_reduction: RatioReduction = "sum",
    num_dims: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate loss of PPO (Schulman et al. 2017, eq. 7), as used by DDPO-IS and GRPO.

    With ``rho = exp(log_prob_new - log_prob_old)`` (after :func:`reduce_log_prob`)::

        loss = mean_i max(-A_i * rho_i, -A_i * clip(rho_i, 1 - eps_low, 1 + eps_high))

    which is the negative of PPO's ``L^CLIP``, so gradient *descent* on it raises the probability
    of samples with positive advantage. DDPO-IS (Black et al. 2023, sec. 4.3, importance-sampled
    estimator with PPO's clipped trust region) and Flow-GRPO (Liu et al. 2025, the GRPO objective
    of its method section) apply it to every trained denoising step.

    Args:
        log_prob_new: ``[B]`` log-densities under the current parameters (carries gradients).
        log_prob_old: ``[B]`` log-densities recorded at rollout time (treated as constants).
        advantages: ``[B]`` advantages (treated as constants).
        clip_range: ``eps`` for a symmetric range, or ``(eps_low, eps_high)``.
        ratio_reduction: ``"sum"`` for the exact ratio, ``"mean"`` for the per-element ratio of
            DDPO / Flow-GRPO (needs ``num_dims``); see the module docstring.
        num_dims: latent elements per sample, for ``"mean"``.

    Returns:
        ``(loss, info)``: the scalar loss and detached scalar diagnostics — ``ratio`` (mean of
        rho), ``clipfrac`` (fraction of rho outside the clip range), ``approx_kl``
        (``0.5 * mean((log rho)^2)``, the k2 estimator DDPO logs) and ``policy_loss``.
    """
    _check_shapes(log_prob_new=log_prob_new, log_prob_old=log_prob_old, advantages=advantages)
    low, high = clip_bounds(clip_range)

    new = reduce_log_prob(log_prob_new.float(), ratio_reduction, num_dims)  # [B]
    old = reduce_log_prob(log_prob_old.detach().float(), ratio_reduction, num_dims)  # [B]
    advantages = advantages.detach().float()  # [B]

    log_ratio = new - old  # [B]
    ratio = torch.exp(log_ratio)  # [B]
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    loss = torch.maximum(unclipped, clipped).mean()

    with torch.no_grad():
        info = {
            "ratio": ratio.mean(),
            "clipfrac": ((ratio < 1.0 - low) | (ratio > 1.0 + high)).float().mean(),
            "approx_kl": 0.5 * (log_ratio**2).mean(),
            "policy_loss": loss.detach(),
        }
    return loss, info


def score_function_loss(
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    ratio_reduction: RatioReduction = "sum",
    num_dims: int | None = None,
) -> torch.Tensor:
    """REINFORCE loss ``-mean(A_i * log p_theta(x_i))`` — DDPO-SF (Black et al. 2023, sec. 4.3).

    Only valid on-policy (one gradient step per rollout). ``ratio_reduction``/``num_dims`` scale
    the log-density as in :func:`ppo_clip_loss`, which rescales the gradient by ``1 / num_dims``.

    Args:
        log_prob: ``[B]`` log-densities under the current parameters.
        advantages: ``[B]`` advantages (treated as constants).
    """
    _check_shapes(log_prob=log_prob, advantages=advantages)
    log_prob = reduce_log_prob(log_prob.float(), ratio_reduction, num_dims)
    return -(advantages.detach().float() * log_prob).mean()
