"""Plain prompt groups: the rollout strategy of DDPO, GRPO, Flow-GRPO, RLCM and DiffusionNFT."""

from __future__ import annotations

from typing import Any

import torch

from genalign.algorithms import PerPromptStatTracker, clip_advantages, group_advantages
from genalign.trainers.strategies.base import (
    STRATEGIES,
    RolloutBatch,
    RolloutContext,
    RolloutStrategy,
    draw_step_groups,
)

__all__ = ["GroupRolloutStrategy"]


@STRATEGIES.register("groups")
class GroupRolloutStrategy(RolloutStrategy):
    """Plain prompt groups: ``group_size`` samples for each of ``prompts_per_step`` prompts.

    Advantages (``train.advantage``): ``group`` — GRPO / Flow-GRPO group-relative normalisation
    (Shao et al. 2024; Liu et al. 2025), with ``advantage_std`` choosing the group's or the global
    std; ``tracker`` — DDPO's per-prompt statistics tracker with a history buffer (Black et al.
    2023, Sec. 5); ``batch`` — normalisation by the batch mean and std.
    """

    def __init__(self, config: Any) -> None:
        self.config = config
        self.tracker = PerPromptStatTracker(config.tracker_buffer_size, config.tracker_min_count)

    def global_batch(
        self, context: RolloutContext, step: int
    ) -> tuple[list[str], torch.Tensor, torch.Tensor]:
        """The step's prompts (each repeated group_size times), group ids and seeds, all global."""
        prompts, group_ids, seeds, _ = draw_step_groups(context.prompts, self.config, step)
        return prompts, group_ids, seeds

    def advantages(self, rewards: torch.Tensor, prompts: list[str], group_ids: torch.Tensor) -> torch.Tensor:
        """Advantages ``[B_global]`` of the global rewards under ``train.advantage``, clipped."""
        config = self.config
        if config.advantage == "group":
            advantages = group_advantages(rewards, group_ids, std=config.advantage_std)
        elif config.advantage == "tracker":
            advantages = self.tracker.update(prompts, rewards)
        else:
            advantages = (rewards - rewards.mean()) / (rewards.std(unbiased=False) + 1e-4)
        return clip_advantages(advantages.float(), config.advantage_clip)

    def sample(self, context: RolloutContext, step: int) -> RolloutBatch:
        prompts, group_ids, seeds = self.global_batch(context, step)
        rows = context.local_rows(len(prompts))
        local_prompts = [prompts[i] for i in rows.tolist()]
        with context.precision():
            trajectory = context.policy.rollout(local_prompts, seeds=seeds[rows], **context.rollout_kwargs())
        trajectory.group_ids = group_ids[rows]
        rewards, details = context.score(trajectory)
        return RolloutBatch.of_groups(context, trajectory, rewards, details, rows, prompts, group_ids)

    def assign_advantages(self, batch: RolloutBatch, context: RolloutContext) -> None:
        advantages = self.advantages(batch.global_rewards, batch.global_prompts, batch.global_group_ids)
        batch.advantages = advantages[batch.global_index].to(context.device)

    def state_dict(self) -> dict[str, Any]:
        return {"tracker": self.tracker.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "tracker" in state:
            self.tracker.load_state_dict(state["tracker"])
