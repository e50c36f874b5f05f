"""KL divergences to a reference policy: closed form for Gaussian steps, sample estimators otherwise.

* :func:`gaussian_step_kl` — two denoising steps with the same noise scale differ only in their
  means, so ``KL(N(mu_theta, s^2 I) || N(mu_ref, s^2 I)) = ||mu_theta - mu_ref||^2 / (2 s^2)``
  exactly; Flow-GRPO (Liu et al. 2025) regularises with this per-step term, its code with the SDE's
  diffusion coefficient ``std_dev_t`` in place of the step std ``std_dev_t sqrt(-dt)`` (the
  ``kl_convention`` option of the ``ppo_clip`` loss passes either as ``std``).
* :func:`kl_k1`, :func:`kl_k2`, :func:`kl_k3` — Schulman's estimators ("Approximating KL
  Divergence", 2020) of ``KL(pi_theta || pi_ref)`` from log-probabilities of samples drawn from
  ``pi_theta``: with ``log r = log pi_ref(x) - log pi_theta(x)``,
  ``k1 = -log r`` (unbiased, high variance, can be negative), ``k2 = (log r)^2 / 2`` (biased, low
  variance, DDPO's logged ``approx_kl``) and ``k3 = (r - 1) - log r`` (unbiased, non-negative;
  trl's GRPO penalty).
"""

from __future__ import annotations

from typing import Literal

import torch

KLEstimator = Literal["k1", "k2", "k3"]

__all__ = ["estimate_kl", "gaussian_step_kl", "kl_k1", "kl_k2", "kl_k3"]


def gaussian_step_kl(
    mean_theta: torch.Tensor,
    mean_ref: torch.Tensor,
    std: torch.Tensor | float,
    reduction: Literal["sum", "mean"] = "sum",
) -> torch.Tensor:
    """Exact KL between two Gaussian steps with shared std, per sample.

    ``KL = sum_j (mu_theta_j - mu_ref_j)^2 / (2 s_j^2)`` over the non-batch dims (Flow-GRPO,
    Liu et al. 2025, KL regulariser of its GRPO objective).

    Args:
        mean_theta: ``[B, ...]`` step mean under the trained policy (carries gradients).
        mean_ref: ``[B, ...]`` step mean under the reference policy.
        std: the step's standard deviation: a float, a ``[B]`` tensor (one per sample; a 1-D
            tensor is always read this way), or any tensor broadcastable to ``mean_theta``.
        reduction: ``"sum"`` gives the exact KL; ``"mean"`` divides it by the number of elements
            per sample, as Flow-GRPO's code does (``.mean(dim=(1, 2, 3))``), so its ``beta``
            carries over.

    Returns:
        float ``[B]``.
    """
    if mean_theta.shape != mean_ref.shape:
        raise ValueError(f"mean shapes differ: {list(mean_theta.shape)} vs {list(mean_ref.shape)}")
    if mean_theta.ndim < 1:
        raise ValueError("means need a batch dimension")
    if isinstance(std, torch.Tensor) and std.ndim == 1 and mean_theta.ndim > 1:
        if std.shape[0] != mean_theta.shape[0]:
            raise ValueError(f"a 1-D std must have shape [B]={mean_theta.shape[0]}, got {list(std.shape)}")
        std = std.view(-1, *([1] * (mean_theta.ndim - 1)))  # [B, 1, ..., 1]
    per_element = (mean_theta.float() - mean_ref.float()) ** 2 / (2 * torch.as_tensor(std).float() ** 2)
    per_element = per_element.expand_as(mean_theta)  # [B, ...]
    dims = tuple(range(1, mean_theta.ndim))
    if reduction == "sum":
        return per_element.sum(dim=dims) if dims else per_element
    if reduction == "mean":
        return per_element.mean(dim=dims) if dims else per_element
    raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")


def kl_k1(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """``k1 = log pi_theta(x) - log pi_ref(x)`` for ``x ~ pi_theta``; unbiased for KL(theta || ref)."""
    return log_prob - ref_log_prob


def kl_k2(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """``k2 = (log pi_theta(x) - log pi_ref(x))^2 / 2``; biased, low variance, non-negative."""
    return 0.5 * (log_prob - ref_log_prob) ** 2


def kl_k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """``k3 = r - 1 - log r`` with ``r = pi_ref(x) / pi_theta(x)``; unbiased and non-negative.

    ``r`` is exponentiated, so pass per-element log-probabilities (see
    :func:`genalign.algorithms.losses.reduce_log_prob`) for high-dimensional latents.
    """
    log_ratio = ref_log_prob - log_prob
    return torch.expm1(log_ratio) - log_ratio


_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def estimate_kl(
    log_prob: torch.Tensor, ref_log_prob: torch.Tensor, estimator: KLEstimator = "k3"
) -> torch.Tensor:
    """Per-sample estimate of ``KL(pi_theta || pi_ref)`` from samples of ``pi_theta``; shape of the inputs."""
    if log_prob.shape != ref_log_prob.shape:
        raise ValueError(f"log-prob shapes differ: {list(log_prob.shape)} vs {list(ref_log_prob.shape)}")
    function = _ESTIMATORS.get(estimator)
    if function is None:
        raise ValueError(f"estimator must be one of {sorted(_ESTIMATORS)}, got {estimator!r}")
    return function(log_prob, ref_log_prob)
