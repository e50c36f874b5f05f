"""The output type of every step kernel, the exact Gaussian log-density, and shared plumbing.

A step kernel is one reverse step ``x_t -> x_{t-1}`` written as a Gaussian policy
``pi(x_{t-1} | x_t) = N(mean, std^2 I)`` (DDPO, Black et al. 2023, Sec. 4.2). Every kernel returns a
:class:`StepOutput`; the private helpers below (timestep batching, x0 conversion, clipping and
thresholding, sampling-or-scoring) are shared by the DDIM, flow and consistency kernels, and
:func:`discrete_step` reads the inputs of the two on a discrete DDPM schedule (DDIM, consistency)
once for both.

Conventions shared by all kernels:

* everything is computed in fp32 whatever the input dtype; ``prev_sample`` is returned in the
  dtype of ``sample`` and its log-probability is that of the value actually returned, so scoring
  the stored sample later reproduces the same number bit for bit;
* a deterministic step (``std == 0``: DDIM with ``eta = 0``, the flow ODE, the last consistency
  step, a flow CPS step to ``sigma_next = 0``) is a point mass: it has no density, and its
  ``log_prob`` is defined as ``0``. It contributes nothing to a policy gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from diffusers.utils.torch_utils import randn_tensor
from torch import Tensor

GeneratorLike = torch.Generator | Sequence[torch.Generator] | None

_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))
_PREDICTION_TYPES = ("epsilon", "v_prediction", "sample")


@dataclass
class StepOutput:
    """One reverse step of a Gaussian step policy.

    Attributes:
        prev_sample: ``[B, ...]`` the sampled (or given) next sample, in the dtype of the input
            ``sample``.
        mean: ``[B, ...]`` fp32 mean of the step policy.
        std: ``[B, 1, ..., 1]`` fp32 per-sample standard deviation, broadcastable to the sample;
            ``0`` for a deterministic step.
        log_prob: ``[B]`` fp32 exact Gaussian log-density of ``prev_sample`` summed over all
            non-batch dimensions (``0`` for a deterministic step). Differentiable w.r.t. the
            model output; ``prev_sample`` is treated as data (detached).
        pred_original_sample: ``[B, ...]`` fp32 clean-sample prediction used by the step (for a
            consistency step, the boundary-conditioned ``denoised`` output).
        kl_std: ``[B, 1, ..., 1]`` fp32 scale of Flow-GRPO's official KL penalty
            ``||mu_theta - mu_ref||^2 / (2 kl_std^2)``. The flow SDE step sets it to the diffusion
            coefficient ``std_t = a sqrt(sigma / (1 - sigma))`` *without* the step's ``sqrt(-dt)``
            (flow_grpo's ``std_dev_t``); every other kernel leaves it ``None``, which means ``std``
            (the exact Gaussian KL), as flow_grpo's CPS step, DDPO and RLCM have it.
    """

    prev_sample: Tensor
    mean: Tensor
    std: Tensor
    log_prob: Tensor
    pred_original_sample: Tensor
    kl_std: Tensor | None = None

    def __post_init__(self) -> None:
        if self.kl_std is None:
            self.kl_std = self.std


def gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Exact log-density of ``x`` under ``N(mean, std^2)``, summed over all non-batch dimensions.

    ``log N(x; mu, s^2) = -(x - mu)^2 / (2 s^2) - log s - log sqrt(2 pi)``, elementwise, as
    ``torch.distributions.Normal(mean, std).log_prob(x)``, then summed over every dimension but the
    first. Where ``std == 0`` (a point mass) the term is defined as ``0``; gradients stay finite.

    Args:
        x: ``[B, ...]`` values to score (any float dtype; cast to fp32).
        mean: ``[B, ...]`` means, broadcastable with ``x``.
        std: standard deviations ``>= 0`` broadcastable with ``x``, e.g. ``[B, 1, 1, 1]``.

    Returns:
        ``[B]`` fp32 log-densities.
    """
    x, mean, std = x.float(), mean.float(), std.float()
    positive = std > 0
    safe_std = torch.where(positive, std, torch.ones_like(std))
    log_density = -((x - mean) ** 2) / (2 * safe_std**2) - safe_std.log() - _LOG_SQRT_2PI
    log_density = torch.where(positive, log_density, torch.zeros_like(log_density))  # (B, ...)
    if log_density.ndim == 1:
        return log_density
    return log_density.sum(dim=tuple(range(1, log_density.ndim)))


def batched_index(value: int | Tensor, batch_size: int, device: torch.device, name: str) -> Tensor:
    """A python int, 0-d tensor or ``[B]`` tensor of integer values as a LongTensor ``[B]``."""
    index = torch.as_tensor(value, device=device)
    if index.is_floating_point():
        rounded = index.round()
        if not torch.equal(rounded, index):
            raise ValueError(f"`{name}` must hold integer values, got {value!r}")
        index = rounded
    index = index.long().reshape(-1)
    if index.numel() == 1:
        return index.expand(batch_size)
    if index.numel() != batch_size:
        raise ValueError(
            f"`{name}` must be a scalar or hold one value per sample ({batch_size}), got {index.numel()}"
        )
    return index


def per_sample(values: Tensor, like: Tensor) -> Tensor:
    """``[B]`` values as fp32 ``[B, 1, ..., 1]`` on ``like``'s device, broadcastable to ``like``."""
    return values.to(device=like.device, dtype=torch.float32).reshape(-1, *([1] * (like.ndim - 1)))


def original_and_epsilon(
    prediction_type: str, model_output: Tensor, sample: Tensor, alpha_prod_t: Tensor
) -> tuple[Tensor, Tensor]:
    """Convert a model output to ``(x0, epsilon)`` under ``x_t = sqrt(a_t) x0 + sqrt(1 - a_t) eps``.

    ``epsilon``: ``x0 = (x_t - sqrt(1 - a_t) eps) / sqrt(a_t)``; ``sample``: the output is ``x0``;
    ``v_prediction`` (Salimans & Ho 2022, ``v = sqrt(a_t) eps - sqrt(1 - a_t) x0``):
    ``x0 = sqrt(a_t) x_t - sqrt(1 - a_t) v``, ``eps = sqrt(a_t) v + sqrt(1 - a_t) x_t``.

    Args:
        prediction_type: one of ``"epsilon"``, ``"v_prediction"``, ``"sample"``.
        model_output, sample: fp32 ``[B, ...]``.
        alpha_prod_t: fp32 ``[B, 1, ..., 1]`` cumulative alpha ``a_t``.
    """
    beta_prod_t = 1 - alpha_prod_t
    if prediction_type == "epsilon":
        epsilon = model_output
        original = (sample - beta_prod_t.sqrt() * epsilon) / alpha_prod_t.sqrt()
    elif prediction_type == "sample":
        original = model_output
        epsilon = (sample - alpha_prod_t.sqrt() * original) / beta_prod_t.sqrt()
    elif prediction_type == "v_prediction":
        original = alpha_prod_t.sqrt() * sample - beta_prod_t.sqrt() * model_output
        epsilon = alpha_prod_t.sqrt() * model_output + beta_prod_t.sqrt() * sample
    else:
        raise ValueError(f"prediction_type must be one of {_PREDICTION_TYPES}, got {prediction_type!r}")
    return original, epsilon


def clip_or_threshold(config: Any, original: Tensor) -> Tensor:
    """Clip or dynamically threshold an x0 prediction as diffusers' DDIM/LCM schedulers do.

    Dynamic thresholding (Saharia et al. 2022, Imagen, Sec. 2.3): per sample, ``s`` is the
    ``dynamic_thresholding_ratio`` quantile of ``|x0|`` clamped to ``[1, sample_max_value]``;
    ``x0 <- clamp(x0, -s, s) / s``. Otherwise, with ``clip_sample``, ``x0`` is clamped to
    ``[-clip_sample_range, clip_sample_range]``.

    Args:
        config: the scheduler's config (``thresholding``, ``clip_sample`` and their parameters).
        original: fp32 ``[B, ...]`` x0 prediction.
    """
    if getattr(config, "thresholding", False):
        batch_size = original.shape[0]
        flat = original.reshape(batch_size, -1)  # (B, D)
        s = torch.quantile(flat.abs(), config.dynamic_thresholding_ratio, dim=1)  # (B,)
        s = s.clamp(min=1, max=config.sample_max_value).reshape(-1, *([1] * (original.ndim - 1)))
        return torch.clamp(original, -s, s) / s
    if getattr(config, "clip_sample", False):
        return original.clamp(-config.clip_sample_range, config.clip_sample_range)
    return original


@dataclass(frozen=True)
class DiscreteStep:
    """What a step kernel on a discrete DDPM schedule (DDIM, consistency) reads first, in fp32:
    the sample ``x`` ``[B, ...]``, the per-sample timesteps ``t`` ``[B]``, the schedule's
    ``alphas_cumprod`` ``[T]`` and ``final_alpha_cumprod``, ``alpha_prod_t`` ``[B, 1, ..., 1]``,
    and the model output as ``original`` (x0, clipped or thresholded as the scheduler's config
    says) and ``epsilon`` (derived from the unclipped x0, as diffusers' default)."""

    x: Tensor
    t: Tensor
    alphas_cumprod: Tensor
    final_alpha: Tensor
    alpha_prod_t: Tensor
    original: Tensor
    epsilon: Tensor

    def alpha_prod(self, timesteps: Tensor) -> Tensor:
        """``a`` ``[B]`` at integer ``timesteps`` ``[B]``; a negative timestep (past the end of the
        schedule) has the scheduler's ``final_alpha_cumprod``."""
        return torch.where(timesteps >= 0, self.alphas_cumprod[timesteps.clamp(min=0)], self.final_alpha)


def discrete_step(
    scheduler: Any, model_output: Tensor, timestep: int | Tensor, sample: Tensor, kernel: str
) -> DiscreteStep:
    """The :class:`DiscreteStep` of a kernel's inputs; ``kernel`` names it in the error raised
    when the scheduler's timesteps are not set."""
    if scheduler.num_inference_steps is None:
        raise ValueError(f"call `scheduler.set_timesteps(...)` before `{kernel}`")
    x = sample.float()  # (B, C, H, W)
    output = model_output.float()  # (B, C, H, W)
    alphas_cumprod = scheduler.alphas_cumprod.float()
    device = alphas_cumprod.device
    t = batched_index(timestep, x.shape[0], device, "timestep")  # (B,)
    final_alpha = torch.as_tensor(scheduler.final_alpha_cumprod, dtype=torch.float32).to(device)
    alpha_prod_t = per_sample(alphas_cumprod[t], x)  # (B, 1, 1, 1)
    original, epsilon = original_and_epsilon(scheduler.config.prediction_type, output, x, alpha_prod_t)
    original = clip_or_threshold(scheduler.config, original)
    return DiscreteStep(x, t, alphas_cumprod, final_alpha, alpha_prod_t, original, epsilon)


def sample_or_score(
    mean: Tensor,
    std: Tensor,
    pred_original_sample: Tensor,
    dtype: torch.dtype,
    prev_sample: Tensor | None,
    generator: GeneratorLike,
    stochastic: bool,
    kl_std: Tensor | None = None,
) -> StepOutput:
    """Draw ``prev_sample = mean + std * z`` (or take the given one) and score it.

    Args:
        mean: fp32 ``[B, ...]`` policy mean.
        std: fp32 ``[B, 1, ..., 1]`` policy standard deviation.
        pred_original_sample: fp32 ``[B, ...]`` x0 prediction, passed through.
        dtype: dtype of the input sample; the returned ``prev_sample`` has it.
        prev_sample: ``[B, ...]`` sample to score instead of sampling, or ``None``. It is scored
            as given (upcast to fp32) and returned cast to ``dtype``.
        generator: a ``torch.Generator`` or one per sample, as ``diffusers``' ``randn_tensor``.
        stochastic: ``False`` when ``std`` is zero for every sample; no noise is drawn then, so
            the generator is left untouched.
        kl_std: the scale of the official KL penalty (:attr:`StepOutput.kl_std`); None: ``std``.
    """
    if prev_sample is None:
        if stochastic:
            if isinstance(generator, Sequence) and len(generator) not in (1, mean.shape[0]):
                raise ValueError(f"got {len(generator)} generators for a batch of {mean.shape[0]}")
            noise = randn_tensor(mean.shape, generator=generator, device=mean.device, dtype=torch.float32)
            prev_sample = (mean + std * noise).to(dtype)  # (B, ...)
        else:
            prev_sample = mean.to(dtype)
    elif prev_sample.shape != mean.shape:
        raise ValueError(f"prev_sample has shape {tuple(prev_sample.shape)}, expected {tuple(mean.shape)}")
    log_prob = gaussian_log_prob(prev_sample.detach(), mean, std)  # (B,)
    return StepOutput(
        prev_sample=prev_sample.to(dtype),
        mean=mean,
        std=std,
        log_prob=log_prob,
        pred_original_sample=pred_original_sample,
        kl_std=kl_std,
    )
