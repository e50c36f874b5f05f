"""Astrolabe's rollouts: prompt groups of block-causal videos with its advantages (arXiv 2603.17051).

The ``ar_video`` family's strategy: each step draws ``prompts_per_step`` prompts with
``group_size`` videos each (the global batch is a pure function of ``(seed, step)``, as every
strategy's), rolls them out block by block with ``train.astrolabe.num_latent_frames`` latent frames
and ``sampling.num_inference_steps`` steps per block, scores them with a video reward
(:class:`genalign.rewards.video.VideoReward` turns any image reward into one) and sets

    A = clip((R - mean of the prompt's rewards) / (std of the batch's rewards + 1e-4), -c, c)

(:func:`genalign.algorithms.astrolabe.astrolabe_advantages`; the official per-prompt tracker with
``global_std=True``, cleared every epoch, and ``train.adv_clip_max`` = 5).

The batch keeps the reward's per-sample details (``RolloutBatch.sample_details``: an ``ensemble``'s
member scores), which the loss ranks for the selective KL (``train.astrolabe.selective_kl``).
"""

from __future__ import annotations

from typing import Any

import torch

from genalign.algorithms.astrolabe import astrolabe_advantages
from genalign.trainers.strategies.base import STRATEGIES, RolloutBatch, RolloutContext
from genalign.trainers.strategies.groups import GroupRolloutStrategy

__all__ = ["AstrolabeStrategy"]


@STRATEGIES.register("astrolabe")
class AstrolabeStrategy(GroupRolloutStrategy):
    """Groups of videos with Astrolabe's advantages (module docstring; ``train.astrolabe``)."""

    def rollout_kwargs(self, context: RolloutContext) -> dict[str, Any]:
        """The ``ar_video`` rollout's keyword arguments from ``sampling`` and ``train.astrolabe``."""
        sampling = context.sampling
        return {
            "num_inference_steps": sampling.num_inference_steps,
            "guidance_scale": sampling.guidance_scale,
            "height": sampling.height,
            "width": sampling.width,
            "num_frames": self.config.astrolabe.num_latent_frames,
        }

    def sample(self, context: RolloutContext, step: int) -> RolloutBatch:
        prompts, group_ids, seeds = self.global_batch(context, step)
        rows = context.local_rows(len(prompts))
        local_prompts = [prompts[i] for i in rows.tolist()]
        with context.precision():
            trajectory = context.policy.rollout(
                local_prompts, seeds=seeds[rows], **self.rollout_kwargs(context)
            )
        trajectory.group_ids = group_ids[rows]
        rewards, details, per_sample = context.score_per_sample(trajectory)
        return RolloutBatch.of_groups(
            context, trajectory, rewards, details, rows, prompts, group_ids, sample_details=per_sample
        )

    def advantages(self, rewards: torch.Tensor, prompts: list[str], group_ids: torch.Tensor) -> torch.Tensor:
        """``[B_global]``: centred on each prompt's mean, over the batch's std, clipped."""
        return astrolabe_advantages(
            rewards.float(), prompts, advantage_clip=self.config.astrolabe.advantage_clip
        )
