"""Multistep consistency sampling as a Gaussian policy (the RLCM policy).

A latent consistency model (Luo et al. 2023, "Latent Consistency Models", eq. 9 and Algorithm 3)
maps ``x_t`` to a clean estimate with boundary-condition scalings
``f(x_t, t) = c_skip(t) x_t + c_out(t) x0_hat(x_t, t)``, ``c_skip = s^2 / ((k t)^2 + s^2)``,
``c_out = k t / sqrt((k t)^2 + s^2)`` (``s = sigma_data = 0.5``, ``k = timestep_scaling``), then
re-noises it to the next timestep ``t'`` of the schedule. RLCM (Oertell et al. 2024, "RL for
Consistency Models: Faster Reward Guided Text-to-Image Generation", Sec. 4) reads that re-noising
as the policy::

    pi(x_{t'} | x_t, c) = N(sqrt(a_{t'}) f(x_t, t), (1 - a_{t'}) I)

The last step of the schedule has no next timestep: ``x_0 = f(x_t, t)`` deterministically
(diffusers' ``LCMScheduler``), or, with ``final_noise=True``, re-noised at its own timestep as
RLCM's released code does (``consistency_step``).

Two timestep schedules exist for the same model. diffusers' ``LCMScheduler`` spreads the
``num_inference_steps`` over the ``original_inference_steps`` (50) LCM training timesteps
``20 k - 1`` with ``floor(linspace)``: for 8 steps 999, 879, 759, 639, 499, 379, 259, 139.
RLCM's patched scheduler (and the original LCM release) takes every ``len // n``-th of them
from the end: 999, 879, 759, 639, 519, 399, 279, 159 (:func:`rlcm_timesteps`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from genalign.sampling.types import GeneratorLike, StepOutput, discrete_step, per_sample, sample_or_score

if TYPE_CHECKING:
    from diffusers import LCMScheduler

SIGMA_DATA = 0.5  # fixed in diffusers' LCMScheduler and the LCM release


def rlcm_timesteps(
    num_inference_steps: int,
    num_train_timesteps: int = 1000,
    original_inference_steps: int = 50,
    strength: float = 1.0,
) -> list[int]:
    """The timesteps of RLCM's patched ``LCMScheduler.set_timesteps`` (Oertell et al. 2024, code
    release; the original LCM pipeline's schedule), largest first.

    The LCM training timesteps are ``c k - 1`` for ``k = 1 .. original_inference_steps * strength``
    with ``c = num_train_timesteps // original_inference_steps``; the schedule walks them from the
    end with stride ``len // num_inference_steps`` and keeps the first ``num_inference_steps``.
    """
    c = num_train_timesteps // original_inference_steps
    origin = [k * c - 1 for k in range(1, int(original_inference_steps * strength) + 1)]
    if not 0 < num_inference_steps <= len(origin):
        raise ValueError(
            f"num_inference_steps must lie in [1, {len(origin)}] for {original_inference_steps} "
            f"original inference steps, got {num_inference_steps}"
        )
    stride = len(origin) // num_inference_steps
    return origin[::-1][::stride][:num_inference_steps]


def consistency_step(
    scheduler: LCMScheduler,
    model_output: Tensor,
    timestep: int | Tensor,
    sample: Tensor,
    prev_sample: Tensor | None = None,
    generator: GeneratorLike = None,
    final_noise: bool = False,
) -> StepOutput:
    """One multistep-consistency step ``x_t -> x_{t'}`` with its exact Gaussian log-probability.

    Mirrors diffusers' ``LCMScheduler.step`` (``prediction_type``, ``clip_sample`` /
    ``thresholding``, ``c_skip`` / ``c_out``, ``denoised = c_out x0_hat + c_skip x_t``) without
    its step counter: each sample's position is found by matching its timestep in
    ``scheduler.timesteps`` (the first match), and ``t'`` is the next entry.

    * non-final step: ``mean = sqrt(a_{t'}) denoised``, ``std = sqrt(1 - a_{t'})``;
    * final step (last entry of ``scheduler.timesteps``), ``final_noise=False`` (default):
      ``prev_sample = mean = denoised``, ``std = 0``, ``log_prob = 0``. diffusers does the same
      (it tests ``step_index == num_inference_steps - 1``, which is the last entry except for
      custom schedules shortened by ``strength``).
    * final step, ``final_noise=True``: RLCM's released scheduler sets ``t' = t`` at the last
      step, draws ``sqrt(a_t) denoised + sqrt(1 - a_t) z`` and counts that Gaussian in the
      log-likelihood (so PPO trains the last step too), while the image is decoded from
      ``denoised``: ``mean = sqrt(a_t) denoised``, ``std = sqrt(1 - a_t)``; the caller decodes
      ``pred_original_sample``. The reward never sees that noise; the option exists to reproduce
      RLCM's training signal.

    Args:
        scheduler: an ``LCMScheduler`` after ``set_timesteps``.
        model_output: ``[B, C, H, W]`` (or any ``[B, ...]``) noise / v / x0 prediction.
        timestep: current timestep, an entry of ``scheduler.timesteps``: python int, 0-d tensor or
            LongTensor ``[B]`` (one per sample).
        sample: ``[B, ...]`` current sample ``x_t``.
        prev_sample: ``[B, ...]`` a given ``x_{t'}`` to score instead of sampling one.
        generator: a ``torch.Generator`` or a list with one per sample.
        final_noise: re-noise the last step at its own timestep and score it (RLCM's code).

    Returns:
        :class:`StepOutput` with fp32 ``mean`` ``[B, ...]``, ``std`` ``[B, 1, ..., 1]``,
        ``log_prob`` ``[B]``, ``pred_original_sample = denoised`` (the consistency output
        ``f(x_t, t)``) and ``prev_sample`` in ``sample.dtype``.
    """
    step = discrete_step(scheduler, model_output, timestep, sample, "consistency_step")
    x, t = step.x, step.t  # (B, C, H, W), (B,)
    schedule = scheduler.timesteps.to(step.alphas_cumprod.device)  # (N,)

    matches = t[:, None] == schedule[None, :]  # (B, N)
    if not bool(matches.any(dim=1).all()):
        raise ValueError(f"timestep {timestep!r} is not in scheduler.timesteps {schedule.tolist()}")
    index = matches.long().argmax(dim=1)  # (B,) first match
    is_last = index == len(schedule) - 1  # (B,)
    prev_t = schedule[(index + 1).clamp(max=len(schedule) - 1)]  # (B,), unused where is_last

    alpha_prod_prev = step.alpha_prod(prev_t)  # (B,)

    # boundary conditions: c_skip(0) = 1, c_out(0) = 0, so f(x, 0) = x
    scaled_t = per_sample(t.float() * scheduler.config.timestep_scaling, x)  # (B, 1, 1, 1)
    c_skip = SIGMA_DATA**2 / (scaled_t**2 + SIGMA_DATA**2)
    c_out = scaled_t / (scaled_t**2 + SIGMA_DATA**2).sqrt()

    denoised = c_out * step.original + c_skip * x  # (B, C, H, W)

    if final_noise:  # RLCM: the last step re-noises to its own timestep, t' = t
        alpha_prod_prev = torch.where(is_last, step.alphas_cumprod[t], alpha_prod_prev)
        is_last = torch.zeros_like(is_last)
    scale = per_sample(torch.where(is_last, torch.ones_like(alpha_prod_prev), alpha_prod_prev.sqrt()), x)
    std = per_sample(torch.where(is_last, torch.zeros_like(alpha_prod_prev), (1 - alpha_prod_prev).sqrt()), x)
    mean = scale * denoised  # (B, C, H, W)

    stochastic = not bool(is_last.all())
    return sample_or_score(mean, std, denoised, sample.dtype, prev_sample, generator, stochastic)
