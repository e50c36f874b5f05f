"""PPO-clip on denoising steps: the loss of DDPO, GRPO, Flow-GRPO, RLCM and B2-DiffuRL."""

from __future__ import annotations

from typing import Any

import torch

from genalign.algorithms import gaussian_step_kl, ppo_clip_loss
from genalign.trainers.losses.base import LOSSES, PolicyLoss

__all__ = ["PPOClipLoss"]


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

    ``cps_log_prob="official"``: on flow CPS steps both log-probs are scaled by ``2 std^2`` (the
    step's, per sample) before the ratio, so with ``ratio_reduction="mean"`` the log-ratio is
    flow_grpo's CPS ``-mean((x - mean_new)^2) + mean((x - mean_old)^2)``: its CPS branch keeps
    only the squared error (Wang & Yu 2025's code, ``sde_step_with_logprob``, ``sde_type="cps"``).
    """

    row_mean = True  # ppo_clip_loss and the step KL are means over rows (train.fuse_timesteps)

    def __init__(self, config: Any) -> None:
        self.config = config

    def __call__(self, policy, trajectory, step_index, advantages):
        config = self.config
        rows = torch.arange(trajectory.batch_size)
        out = policy.step(trajectory, step_index)
        old_log_prob = trajectory.log_probs[rows, step_index.cpu()].to(out.log_prob.device)
        num_dims = trajectory.latents[0, 0].numel()
        log_prob = out.log_prob
        mode = getattr(getattr(trajectory, "settings", None), "mode", None)
        if config.cps_log_prob == "official" and mode == "cps":
            # (B,): the step's std, the same for the old and the new policy
            scale = 2 * out.std.detach().reshape(len(rows)).to(log_prob.dtype) ** 2
            log_prob, old_log_prob = log_prob * scale, old_log_prob * scale
        loss, info = ppo_clip_loss(
            log_prob, old_log_prob, advantages, config.clip_range, config.ratio_reduction, num_dims
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
