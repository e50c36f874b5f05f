"""Rectified-flow steps as Gaussian policies: the Flow-GRPO SDE, coefficients-preserving sampling, ODE.

Rectified flow interpolates ``x_sigma = (1 - sigma) x0 + sigma eps`` and the model predicts the
velocity ``v = eps - x0``; sampling runs sigma from 1 down to 0 along ``scheduler.sigmas``.

* ``"sde"`` (Liu et al. 2025, "Flow-GRPO: Training Flow Matching Models via Online RL", eq. 9
  discretised by Euler-Maruyama): the reverse SDE with the same marginals as the ODE, diffusion
  ``std_t = noise_level * sqrt(sigma / (1 - sigma))``::

      x_next = x + [v + std_t^2 / (2 sigma) (x + (1 - sigma) v)] dt + std_t sqrt(-dt) z

* ``"cps"`` (Wang & Yu 2025, "Coefficients-Preserving Sampling for Reinforcement Learning with
  Flow Matching"): re-noise the clean estimate so the coefficients of ``x0`` and noise match the
  forward process at ``sigma_next`` exactly::

      x_next = (1 - sigma_next) x0_hat + sqrt(sigma_next^2 - s^2) eps_hat + s z,
      x0_hat = x - sigma v,  eps_hat = x + (1 - sigma) v,  s = sigma_next sin(noise_level pi / 2)

* ``"ode"``: the Euler step ``x_next = x + v dt`` (deterministic; ``log_prob = 0``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from genalign.sampling.types import GeneratorLike, StepOutput, batched_index, per_sample, sample_or_score

if TYPE_CHECKING:
    from diffusers import FlowMatchEulerDiscreteScheduler

FLOW_MODES = ("sde", "cps", "ode")


def flow_sde_step(
    scheduler: FlowMatchEulerDiscreteScheduler,
    velocity: Tensor,
    step_index: int | Tensor,
    sample: Tensor,
    noise_level: float = 0.7,
    mode: Literal["sde", "cps", "ode"] = "sde",
    prev_sample: Tensor | None = None,
    generator: GeneratorLike = None,
) -> StepOutput:
    """One flow-matching step ``sigma -> sigma_next`` with the exact Gaussian log-probability.

    ``sigma = scheduler.sigmas[step_index]``, ``sigma_next = scheduler.sigmas[step_index + 1]``,
    ``dt = sigma_next - sigma < 0``. Pure: reads ``scheduler.sigmas`` only, never its step counter.

    * ``"sde"``: ``std = std_t sqrt(-dt)``. At ``sigma == 1`` the ratio ``sigma / (1 - sigma)`` is
      infinite; as in flow_grpo, ``sigmas[1]`` replaces ``sigma`` in the denominator there.
      The step to ``sigma_next = 0`` is still stochastic (``std = std_t sqrt(sigma)``).
      ``kl_std = std_t``: flow_grpo's KL penalty divides by ``2 std_t^2`` (its ``std_dev_t``, no
      ``sqrt(-dt)``), ``1 / |dt|`` times less than the exact step KL ``/ (2 std^2)``.
    * ``"cps"``: ``std = sigma_next sin(noise_level pi / 2)``; ``log_prob`` is the exact density
      (flow_grpo keeps only ``-(x - mean)^2``). The step to ``sigma_next = 0`` is deterministic
      (``mean = x0_hat``, ``std = 0``, ``log_prob = 0``). ``kl_std = std``: flow_grpo's CPS
      ``std_dev_t`` is the step std, so its KL is the exact one.
    * ``"ode"``: Euler, ``std = 0``, ``log_prob = 0``; equals ``FlowMatchEulerDiscreteScheduler.step``.

    ``noise_level = 0`` makes ``"sde"`` the Euler ODE step and ``"cps"`` the DDIM-like
    deterministic step.

    Args:
        scheduler: a flow-matching scheduler with ``sigmas`` (``[N + 1]``, ending at 0) after
            ``set_timesteps``.
        velocity: ``[B, ...]`` predicted velocity ``v = eps - x0``.
        step_index: index into ``scheduler.sigmas``: python int, 0-d tensor or LongTensor ``[B]``.
        sample: ``[B, ...]`` current sample ``x_sigma``.
        noise_level: ``a`` in Flow-GRPO's ``std_t = a sqrt(sigma / (1 - sigma))``; for ``"cps"`` the
            angle fraction in ``sin(a pi / 2)``. Must be ``>= 0``.
        mode: ``"sde"``, ``"cps"`` or ``"ode"``.
        prev_sample: ``[B, ...]`` a given ``x_{sigma_next}`` to score instead of sampling one.
        generator: a ``torch.Generator`` or a list with one per sample.

    Returns:
        :class:`StepOutput` with fp32 ``mean`` ``[B, ...]``, ``std`` and ``kl_std``
        ``[B, 1, ..., 1]``, ``log_prob`` ``[B]``, ``pred_original_sample = x - sigma v`` and
        ``prev_sample`` in ``sample.dtype``.
    """
    if mode not in FLOW_MODES:
        raise ValueError(f"mode must be one of {FLOW_MODES}, got {mode!r}")
    if noise_level < 0:
        raise ValueError(f"noise_level must be >= 0, got {noise_level}")
    sigmas = scheduler.sigmas.float()  # (N + 1,)
    x = sample.float()  # (B, C, H, W)
    v = velocity.float()  # (B, C, H, W)
    index = batched_index(step_index, x.shape[0], sigmas.device, "step_index")  # (B,)
    if int(index.min()) < 0 or int(index.max()) + 1 >= len(sigmas):
        raise ValueError(f"step_index must lie in [0, {len(sigmas) - 2}], got {step_index!r}")
    sigma = per_sample(sigmas[index], x)  # (B, 1, 1, 1)
    sigma_next = per_sample(sigmas[index + 1], x)  # (B, 1, 1, 1)
    dt = sigma_next - sigma  # (B, 1, 1, 1), negative
    original = x - sigma * v  # x0_hat, (B, C, H, W)
    kl_std = None  # the step std, unless the SDE's official KL scale differs

    if mode == "sde":
        sigma_max = sigmas[1].to(x.device)
        std_t = noise_level * torch.sqrt(sigma / (1 - torch.where(sigma == 1, sigma_max, sigma)))
        # drift of the marginal-preserving SDE: v - (std_t^2 / 2) * score, score = -(x + (1 - sigma) v) / sigma
        mean = x * (1 + std_t**2 / (2 * sigma) * dt) + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
        std = std_t * torch.sqrt((-dt).clamp(min=0))  # (B, 1, 1, 1)
        kl_std = std_t  # flow_grpo's std_dev_t, (B, 1, 1, 1)
        stochastic = noise_level > 0
    elif mode == "cps":
        noise_estimate = x + (1 - sigma) * v  # eps_hat, (B, C, H, W)
        std = sigma_next * math.sin(noise_level * math.pi / 2)  # (B, 1, 1, 1)
        mean = (1 - sigma_next) * original + (sigma_next**2 - std**2).clamp(min=0).sqrt() * noise_estimate
        stochastic = noise_level > 0
    else:
        mean = x + v * dt  # Euler
        std = torch.zeros_like(sigma)
        stochastic = False

    return sample_or_score(mean, std, original, sample.dtype, prev_sample, generator, stochastic, kl_std)
