"""Supervised fine-tuning of a ``language`` policy: the next-token loss on given targets."""

from __future__ import annotations

from typing import Any

from genalign.algorithms import next_token_loss
from genalign.trainers.losses.base import LOSSES, PolicyLoss

__all__ = ["SFTLoss"]


@LOSSES.register("sft")
class SFTLoss(PolicyLoss):
    """``-mean log p_theta(x_l | x_<l, I)`` over the target tokens of a teacher-forced batch.

    RLRF's stage 1 ("SVG-SFT", Rodriguez et al. 2025, arXiv 2505.20793, Sec. 3.1). The ``sft``
    strategy builds the batch (:func:`genalign.policies.teacher_forced_trajectory`): the
    trajectory's ``completion_mask`` marks the target tokens, so prompt and padding never count.
    Advantages and the step index are ignored; ``train.sft.aggregation`` chooses the token or the
    sequence mean (:func:`genalign.algorithms.next_token_loss`).
    """

    def __init__(self, config: Any) -> None:  # the recipe's TrainConfig
        self.config = config

    def __call__(self, policy, trajectory, step_index, advantages):
        log_probs = policy.log_prob(trajectory)  # (B, L) at the trajectory's temperature (1)
        mask = trajectory.completion_mask.to(log_probs.device)
        loss, info = next_token_loss(log_probs, mask, self.config.sft.aggregation)
        return loss, {"sft_loss": loss.detach(), **info}
