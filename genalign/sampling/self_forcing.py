"""Self-Forcing's block sampler: the shifted few-step grid and its re-noising step kernel.

Self-Forcing (Huang et al. 2025, arXiv 2506.08009) samples a distilled causal video model block by
block. Per block of latent frames it runs a few steps on a warped grid; each step predicts the
clean block x0 from the flow output and re-noises it to the next level with *fresh* noise:

    x0_hat = x_t - sigma_t v_theta(x_t, t)                       (flow matching, x_t = (1 - s) x0 + s eps)
    x_next = (1 - sigma_next) x0_hat + sigma_next eps',  eps' ~ N(0, I)

so a step is the Gaussian policy ``N((1 - sigma_next) x0_hat, sigma_next^2 I)``; the last step
returns x0_hat itself (a point mass, ``log_prob = 0``). The grid: the official denoising list
(1000, 750, 500, 250) is warped through Wan's ``FlowMatchScheduler(shift=5)``,
``sigma(s) = shift s / (1 + (shift - 1) s)`` at ``s = t / 1000`` (``warp_denoising_step``), giving
model timesteps 1000, 937.5, 833.3, 625 with ``sigma = timestep / 1000``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from genalign.sampling.types import GeneratorLike, StepOutput, per_sample, sample_or_score

__all__ = [
    "SELF_FORCING_DENOISING_STEPS",
    "self_forcing_step",
    "self_forcing_timesteps",
    "uniform_denoising_steps",
]

# ``denoising_step_list`` of the Self-Forcing / Astrolabe Wan configs (before warping)
SELF_FORCING_DENOISING_STEPS: tuple[int, ...] = (1000, 750, 500, 250)


def uniform_denoising_steps(num_steps: int, num_train_timesteps: int = 1000) -> list[int]:
    """``num_steps`` grid values ``T, T (n-1)/n, ..., T/n`` (4 steps: 1000, 750, 500, 250)."""
    if num_steps <= 0:
        raise ValueError(f"num_steps must be positive, got {num_steps}")
    return [num_train_timesteps * (num_steps - i) // num_steps for i in range(num_steps)]


def self_forcing_timesteps(
    denoising_steps: Sequence[int] = SELF_FORCING_DENOISING_STEPS,
    shift: float = 5.0,
    num_train_timesteps: int = 1000,
) -> Tensor:
    """The warped model timesteps ``[n]`` (fp32): ``T sigma(t / T)`` with
    ``sigma(s) = shift s / (1 + (shift - 1) s)``; ``shift = 1`` leaves the grid as given."""
    s = torch.tensor([float(t) for t in denoising_steps], dtype=torch.float64) / num_train_timesteps
    if s.numel() == 0 or bool((s <= 0).any()) or bool((s > 1).any()):
        raise ValueError(
            f"denoising_steps must lie in (0, {num_train_timesteps}], got {list(denoising_steps)}"
        )
    sigma = shift * s / (1 + (shift - 1) * s)
    return (sigma * num_train_timesteps).float()


def self_forcing_step(
    velocity: Tensor,
    sample: Tensor,
    sigma: Tensor | float,
    sigma_next: Tensor | float,
    prev_sample: Tensor | None = None,
    generator: GeneratorLike = None,
) -> StepOutput:
    """One Self-Forcing step of a block: predict x0, then re-noise it to ``sigma_next``.

    Args:
        velocity: ``[B, ...]`` the flow output ``v = eps - x0`` at ``sample``.
        sample: ``[B, ...]`` x_t at noise level ``sigma``.
        sigma / sigma_next: per-sample ``[B]`` (or scalar) noise levels of this step and the
            next; ``sigma_next = 0`` is the block's last step (x0_hat returned, deterministic).
        prev_sample: ``[B, ...]`` a recorded next sample to score instead of drawing one.
        generator: one ``torch.Generator`` per sample (the re-noising noise eps').

    Returns:
        :class:`StepOutput` with ``mean = (1 - sigma_next) x0_hat``, ``std = sigma_next`` and the
        exact Gaussian ``log_prob`` ``[B]`` of ``prev_sample``; ``pred_original_sample = x0_hat``.
    """
    batch = sample.shape[0]
    sigma = per_sample(torch.as_tensor(sigma, dtype=torch.float32).expand(batch), sample)
    sigma_next = per_sample(torch.as_tensor(sigma_next, dtype=torch.float32).expand(batch), sample)
    x0 = sample.float() - sigma * velocity.float()  # (B, ...)
    mean = (1 - sigma_next) * x0
    stochastic = bool((sigma_next > 0).any())
    return sample_or_score(mean, sigma_next, x0, sample.dtype, prev_sample, generator, stochastic)
