"""Losses: how sampled trajectories and their advantages become gradients.

A loss gets a minibatch of trajectories, one step index per sample and the advantages, and
returns a scalar (the mean over the minibatch) plus metrics.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from genalign.algorithms import gaussian_step_kl, ppo_clip_loss
from genalign.policies import Trajectory
from genalign.registry import Registry

if TYPE_CHECKING:
    from genalign.policies import DiffusionPolicy

LOSSES: Registry[type[PolicyLoss]] = Registry("loss")


# -- shared by the forward-process losses (DiffusionNFT, RWR, ReFL) ---------------------------------


def seeded_noise(
    seeds: torch.Tensor, step_index: torch.Tensor, shape: torch.Size, step: int = 0
) -> torch.Tensor:
    """eps ``[B, *shape]`` (float32, CPU), one generator per sample keyed by (training step, sample
    seed, step index), so N processes draw what one process would and a resumed run draws the same."""
    rows = []
    for seed, index in zip(seeds.tolist(), step_index.tolist()):
        key = ((step * 1_000_003 + int(seed)) * 1_000_003 + int(index) + 1) % (2**63 - 1)
        rows.append(torch.randn(shape, generator=torch.Generator().manual_seed(key), dtype=torch.float32))
    return torch.stack(rows)


def conditional_settings(policy: Any, settings: Any) -> Any:
    """The settings for a conditional (unguided) prediction: guidance 1 unless the guidance scale
    is an input of the denoiser (guidance-distilled FLUX, LCM's w-embedding), where it stays."""
    embedded = bool(getattr(policy, "guidance_embedded", False))
    unet = getattr(getattr(policy, "pipeline", None), "unet", None)
    if unet is not None and getattr(unet.config, "time_cond_proj_dim", None) is not None:
        embedded = True
    return settings if embedded else dataclasses.replace(settings, guidance_scale=1.0)


def reference_output_kl(
    policy: DiffusionPolicy,
    output: torch.Tensor,
    x_t: torch.Tensor,
    step_index: torch.Tensor,
    conditioning: dict[str, torch.Tensor],
    settings: Any,
) -> torch.Tensor:
    """``||f_theta - f_ref||^2`` per sample ``[B]`` (mean over elements): the denoiser's ``output``
    against the reference model's at the same input, the KL stand-in of the forward-process losses."""
    with torch.no_grad(), policy.reference():
        reference = policy.predict(x_t, step_index, conditioning, settings).float()
    return ((output.float() - reference) ** 2).mean(dim=tuple(range(1, output.ndim)))


class PolicyLoss:
    def __call__(
        self,
        policy: DiffusionPolicy,
        trajectory: Trajectory,
        step_index: torch.Tensor,
        advantages: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError


@LOSSES.register("ppo_clip")
class PPOClipLoss(PolicyLoss):
    """PPO-clip on denoising steps (DDPO-IS, Black et al. 2023, eq. 4 with PPO's clipping; GRPO /
    Flow-GRPO, Liu et al. 2025, eq. 6), plus Flow-GRPO's KL to the reference policy:
    ``KL(pi_theta || pi_ref) = ||mu_theta - mu_ref||^2 / (2 s^2)`` per step (eq. 7).

    ``ratio_reduction="mean"`` divides log-probs by the number of latent elements before the
    ratio, as DDPO and Flow-GRPO do, so their clip ranges carry over; ``"sum"`` uses exact ratios.

    ``kl_convention`` picks ``s``: ``"official"`` is the step's ``kl_std``, for the flow SDE
    flow_grpo's ``std_dev_t = noise_level sqrt(sigma / (1 - sigma))`` without the Euler-Maruyama
    ``sqrt(-dt)`` (Flow-GRPO's code, ``train_sd3.py``: ``kl_loss = ((mean - mean_ref)**2).mean((1,
    2, 3)) / (2 * std_dev_t**2)``), so its ``beta`` carries over; ``"exact"`` is the step std, the
    exact KL between the two Gaussian step policies, ``1 / |dt|`` times the official value for
    the flow SDE. For flow CPS, DDIM and consistency steps ``kl_std == std`` and they agree.
    ``kl_reduction`` ("mean" over latent elements as flow_grpo, or "sum") applies to either.
    """

    def __init__(self, config: Any) -> None:
        self.config = config

    def __call__(self, policy, trajectory, step_index, advantages):
        config = self.config
        rows = torch.arange(trajectory.batch_size)
        out = policy.step(trajectory, step_index)
        old_log_prob = trajectory.log_probs[rows, step_index.cpu()].to(out.log_prob.device)
        num_dims = trajectory.latents[0, 0].numel()
        loss, info = ppo_clip_loss(
            out.log_prob, old_log_prob, advantages, config.clip_range, config.ratio_reduction, num_dims
        )
        metrics = {
            "policy_loss": info["policy_loss"].detach(),
            "clipfrac": info["clipfrac"].detach(),
            "approx_kl": info["approx_kl"].detach(),
            "ratio": info["ratio"].detach().mean(),
        }
        if config.kl_coef > 0:
            with torch.no_grad(), policy.reference():
                reference = policy.step(trajectory, step_index)
            std = out.kl_std if config.kl_convention == "official" else out.std  # (B, 1, ..., 1)
            kl = gaussian_step_kl(out.mean, reference.mean, std, reduction=config.kl_reduction)  # (B,)
            loss = loss + config.kl_coef * kl.mean()
            metrics["kl"] = kl.detach().mean()
        return loss, metrics
