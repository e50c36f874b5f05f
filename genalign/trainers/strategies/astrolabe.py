"""Astrolabe's rollouts: prompt groups of block-causal videos with its advantages (arXiv 2603.17051).

The ``ar_video`` family's strategy: each step draws ``prompts_per_step`` prompts with
``group_size`` videos each (the global batch is a pure function of ``(seed, step)``, as every
strategy's), rolls them out block by block with ``train.astrolabe.num_latent_frames`` latent frames
and ``sampling.num_inference_steps`` steps per block, scores them with a video reward
(:class:`genalign.rewards.video.VideoReward` turns any image reward into one) and sets

    A = clip((R - mean of the prompt's rewards) / (std of the batch's rewards + 1e-4), -c, c)

(:func:`genalign.algorithms.astrolabe.astrolabe_advantages`; the official per-prompt tracker with
``global_std=True``, cleared every epoch, and ``train.adv_clip_max`` = 5).

Under ``train.astrolabe.window_per_step`` (the released streaming config's window-level reward)
each step first draws one streaming window, uniform over the block starts that fit in
``num_latent_frames`` and keyed by ``(seed, step)``; the videos are rolled out only to the window's
end, the reward scores the pixel frames decoded from the window's latent frames, and the window
``(start, stop)`` travels with the trajectory (``extras["astrolabe_window"]``) to every loss call.

The batch keeps the reward's per-sample details (``RolloutBatch.sample_details``: an ``ensemble``'s
member scores), which the loss ranks for the selective KL (``train.astrolabe.selective_kl``).
"""

from __future__ import annotations

from typing import Any

import torch

from genalign.algorithms.astrolabe import astrolabe_advantages, draw_window_start, window_pixel_frames
from genalign.trainers.strategies.base import STRATEGIES, RolloutBatch, RolloutContext, step_generator
from genalign.trainers.strategies.groups import GroupRolloutStrategy

__all__ = ["WINDOW_KEY", "AstrolabeStrategy"]

WINDOW_KEY = "astrolabe_window"  # trajectory.extras: the step's streaming window (start, stop)


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

    def step_window(self, policy: Any, step: int) -> tuple[int, int] | None:
        """This step's streaming window ``(start, stop)`` in latent frames under
        ``window_per_step`` (None otherwise), the same on every process."""
        options = self.config.astrolabe
        if not options.window_per_step:
            return None
        num_frames = policy.check_num_frames(options.num_latent_frames)
        window = options.window_frames
        generator = step_generator(self.config.seed, step, -1)  # loss calls use keys >= 0
        start = draw_window_start(generator, num_frames, window, policy.block_size)
        return start, min(start + window, num_frames)

    def sample(self, context: RolloutContext, step: int) -> RolloutBatch:
        prompts, group_ids, seeds = self.global_batch(context, step)
        rows = context.local_rows(len(prompts))
        local_prompts = [prompts[i] for i in rows.tolist()]
        kwargs = self.rollout_kwargs(context)
        window = self.step_window(context.policy, step)
        if window is not None:
            kwargs["num_frames"] = window[1]  # frames after the window are never used
        with context.precision():
            trajectory = context.policy.rollout(local_prompts, seeds=seeds[rows], **kwargs)
        trajectory.group_ids = group_ids[rows]
        outputs = None
        if window is not None:
            trajectory.extras[WINDOW_KEY] = window
            first, end = window_pixel_frames(*window, context.policy.temporal_factor)
            outputs = trajectory.images[:, first:end]
        rewards, details, per_sample = context.score_per_sample(trajectory, outputs)
        return RolloutBatch.of_groups(
            context, trajectory, rewards, details, rows, prompts, group_ids, sample_details=per_sample
        )

    def advantages(self, rewards: torch.Tensor, prompts: list[str], group_ids: torch.Tensor) -> torch.Tensor:
        """``[B_global]``: centred on each prompt's mean, over the batch's std, clipped."""
        return astrolabe_advantages(
            rewards.float(), prompts, advantage_clip=self.config.astrolabe.advantage_clip
        )
