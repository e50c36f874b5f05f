"""Token-level PPO for the ``language`` family: GRPO, DAPO, Dr. GRPO and PromptRL's LM loss."""

from __future__ import annotations

from typing import Any

import torch

from genalign.algorithms import token_ppo_loss
from genalign.trainers.losses.base import LOSSES, PolicyLoss

__all__ = ["TokenPPOLoss"]


@LOSSES.register("token_ppo")
class TokenPPOLoss(PolicyLoss):
    """The token-level clipped surrogate with a k3 KL to the reference, on sampled completions.

    Per completion token ``t`` of sequence ``i`` with ``rho = exp(log pi_theta - log pi_old)``::

        l_it = max(-A_i rho_it, -A_i clip(rho_it, 1 - eps_low, 1 + eps_high)) + beta k3_it

    (GRPO, Shao et al. 2024, "DeepSeekMath", eq. 3 with the k3 KL of eq. 4; DAPO's asymmetric
    clip, Yu et al. 2025, eq. 10), aggregated over the completion mask as ``train.token_ppo.
    aggregation`` says (:func:`genalign.algorithms.token_ppo.aggregate_tokens`). With one update
    per batch the ratio is 1 and this is PromptRL's LM loss (arXiv 2602.01382; UniRL's
    ``exp(logp - logp.detach()) * A - 0.01 * k3``, a per-sequence mean then the batch mean).

    Options: ``train.token_ppo`` (``eps_low``, ``eps_high``, ``aggregation``) and ``train.kl_coef``
    (beta; 0 skips the reference forward). ``"constant"`` aggregation divides by ``B *
    max_new_tokens`` of the trajectory's sampling settings. The step index the trainer passes is
    ignored: a completion is one step.
    """

    def __init__(self, config: Any) -> None:  # the recipe's TrainConfig
        self.config = config

    def __call__(self, policy, trajectory, step_index, advantages):
        log_probs = policy.log_prob(trajectory)  # (B, L) under the current weights
        return self.token_loss(policy, trajectory, log_probs, advantages)

    def token_loss(
        self,
        policy: Any,
        trajectory: Any,
        log_probs: torch.Tensor,
        advantages: torch.Tensor,
        clip_range: tuple[float, float] | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss and metrics given the current ``log_probs`` ``[B, L]`` (a loss composing this
        one, Q-Hawkeye's, reuses them); ``clip_range``: ``(eps_low, eps_high)`` instead of
        ``train.token_ppo``'s (:data:`~genalign.algorithms.NO_CLIP`: no clipping)."""
        options = self.config.token_ppo
        kl_coef = float(self.config.kl_coef)
        device = log_probs.device
        reference = None
        if kl_coef > 0:
            with torch.no_grad(), policy.reference():
                reference = policy.log_prob(trajectory)  # (B, L)
        loss, info = token_ppo_loss(
            log_probs,
            trajectory.log_probs.to(device),
            advantages.to(device),
            trajectory.completion_mask.to(device),
            clip_range=clip_range or (options.eps_low, options.eps_high),
            ref_log_probs=reference,
            kl_coef=kl_coef,
            aggregation=options.aggregation,
            max_tokens=trajectory.settings.max_new_tokens,
        )
        metrics = {key: value.detach() for key, value in info.items()}
        metrics["completion_tokens"] = trajectory.completion_mask.sum(dim=1).float().mean()
        return loss, metrics
