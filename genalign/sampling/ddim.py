"""DDIM step as a Gaussian policy with an exact log-probability (the DDPO policy).

DDIM (Song et al. 2021, "Denoising Diffusion Implicit Models", eq. 12)::

    x_{t-1} = sqrt(a_{t-1}) x0_hat + sqrt(1 - a_{t-1} - sigma_t^2) eps_hat + sigma_t z,   z ~ N(0, I)
    sigma_t = eta * sqrt((1 - a_{t-1}) / (1 - a_t) * (1 - a_t / a_{t-1}))           (eq. 16)

with ``a_t`` the cumulative product of alphas. DDPO (Black et al. 2023, "Training Diffusion
Models with Reinforcement Learning", Sec. 4.2) reads this as the policy
``pi(x_{t-1} | x_t, c) = N(mean, sigma_t^2 I)`` and optimises its log-likelihood.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from genalign.sampling.types import GeneratorLike, StepOutput, discrete_step, per_sample, sample_or_score

if TYPE_CHECKING:
    from diffusers import DDIMScheduler


def ddim_step(
    scheduler: DDIMScheduler,
    model_output: Tensor,
    timestep: int | Tensor,
    sample: Tensor,
    eta: float = 1.0,
    prev_sample: Tensor | None = None,
    generator: GeneratorLike = None,
) -> StepOutput:
    """One DDIM step ``x_t -> x_{t-1}`` with the exact Gaussian log-probability of ``x_{t-1}``.

    The mean is that of diffusers' ``DDIMScheduler.step`` (same ``prediction_type``,
    ``clip_sample`` / ``thresholding``, ``set_alpha_to_one`` handling, and
    ``prev_timestep = t - num_train_timesteps // num_inference_steps``; the model output is not
    re-derived from a clipped x0, as with diffusers' default ``use_clipped_model_output=False``).
    Pure: reads ``scheduler.alphas_cumprod`` and its config, never its step counter.

    With ``eta = 0`` (or at a final step whose ``a_{t-1} = 1``) the step is deterministic:
    ``std = 0``, ``prev_sample = mean`` and ``log_prob = 0`` by convention.

    Args:
        scheduler: a ``DDIMScheduler`` (or one with the same fields) after ``set_timesteps``.
        model_output: ``[B, C, H, W]`` (or any ``[B, ...]``) noise / v / x0 prediction.
        timestep: current timestep ``t``: python int, 0-d tensor or LongTensor ``[B]`` (one per sample).
        sample: ``[B, ...]`` current sample ``x_t``.
        eta: DDIM noise scale ``>= 0``; ``1`` is DDPM-like, ``0`` deterministic DDIM.
        prev_sample: ``[B, ...]`` a given ``x_{t-1}`` to score instead of sampling one.
        generator: a ``torch.Generator`` or a list with one per sample.

    Returns:
        :class:`StepOutput` with fp32 ``mean`` ``[B, ...]``, ``std`` ``[B, 1, ..., 1]``,
        ``log_prob`` ``[B]``, ``pred_original_sample`` ``[B, ...]`` and ``prev_sample`` in
        ``sample.dtype``.
    """
    step = discrete_step(scheduler, model_output, timestep, sample, "ddim_step")
    if eta < 0:
        raise ValueError(f"eta must be >= 0, got {eta}")
    prev_t = step.t - scheduler.config.num_train_timesteps // scheduler.num_inference_steps  # (B,)
    alpha_prod_t = step.alpha_prod_t  # (B, 1, 1, 1)
    alpha_prod_prev = per_sample(step.alpha_prod(prev_t), step.x)  # (B, 1, 1, 1)

    # sigma_t^2 = (1 - a_{t-1}) / (1 - a_t) * (1 - a_t / a_{t-1})   (eq. 16)
    variance = (1 - alpha_prod_prev) / (1 - alpha_prod_t) * (1 - alpha_prod_t / alpha_prod_prev)
    std = eta * variance.clamp(min=0).sqrt()  # (B, 1, 1, 1)
    # eq. 12: "predicted x0" + "direction pointing to x_t" (the clamp only guards rounding; eta > 1
    # would make it bite, which diffusers turns into NaN)
    direction = (1 - alpha_prod_prev - std**2).clamp(min=0).sqrt() * step.epsilon
    mean = alpha_prod_prev.sqrt() * step.original + direction  # (B, C, H, W)

    return sample_or_score(mean, std, step.original, sample.dtype, prev_sample, generator, stochastic=eta > 0)
