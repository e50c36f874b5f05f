"""Losses: how sampled trajectories and their advantages become gradients.

A loss gets a minibatch of trajectories, one step index per sample and the advantages, and
returns a scalar (the mean over the minibatch) plus metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from genalign.algorithms import gaussian_step_kl, ppo_clip_loss
from genalign.policies import Trajectory
from genalign.registry import Registry

if TYPE_CHECKING:
    from genalign.policies import DiffusionPolicy

LOSSES: Registry[type[PolicyLoss]] = Registry("loss")


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
    ``KL(pi_theta || pi_ref) = ||mu_theta - mu_ref||^2 / (2 sigma^2)`` per step (eq. 7).

    ``ratio_reduction="mean"`` divides log-probs by the number of latent elements before the
    ratio, as DDPO and Flow-GRPO do, so their clip ranges carry over; ``"sum"`` uses exact ratios.
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
            kl = gaussian_step_kl(out.mean, reference.mean, out.std, reduction=config.kl_reduction)  # (B,)
            loss = loss + config.kl_coef * kl.mean()
            metrics["kl"] = kl.detach().mean()
        return loss, metrics
