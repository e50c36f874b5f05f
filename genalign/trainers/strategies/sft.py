"""Supervised fine-tuning of a ``language`` policy as a strategy of the one trainer.

RLRF's stage 1 ("SVG-SFT", Rodriguez et al. 2025, arXiv 2505.20793, Sec. 3.1) fine-tunes the
SVG writer on (input, SVG) pairs before any RL. Here a step's "rollouts" are the step's pairs laid
out teacher-forced (:func:`genalign.policies.teacher_forced_trajectory`) and the ``sft`` loss is
their next-token loss, so checkpoints, exact resume, minibatches, gradient accumulation, the
learning-rate schedule and the export are the RL trainer's own.

Data order: the pool (a :class:`~genalign.trainers.prompt_pool.PromptPool`) is walked in epochs
without replacement; epoch ``e`` is a permutation drawn from ``(train.seed, e)`` and step ``s``
takes the global positions ``s * B ... (s + 1) * B - 1`` (B = ``train.samples_per_step``), so a
step's pairs are a pure function of ``(seed, step)`` and a resumed run sees exactly the pairs the
uninterrupted one would. There are no rewards: ``rewards`` are 0 and advantages 1 (unused by the
loss); the loss metrics are ``sft_loss``, ``nll_token_mean`` and ``target_tokens``.
"""

from __future__ import annotations

from typing import Any

import torch

from genalign.policies import TokenSettings, teacher_forced_trajectory
from genalign.trainers.prompt_pool import PromptPool
from genalign.trainers.strategies.base import (
    STRATEGIES,
    RolloutBatch,
    RolloutContext,
    RolloutStrategy,
    step_generator,
)

__all__ = ["SFTStrategy", "epoch_indices"]


def epoch_indices(pool_size: int, seed: int, start: int, count: int) -> torch.Tensor:
    """``[count]`` pool rows at global positions ``start ... start + count - 1`` of the
    epoch-by-epoch walk (epoch ``e`` a permutation drawn from ``(seed, e)``)."""
    positions = torch.arange(start, start + count)
    epochs = positions // pool_size
    orders = {
        int(e): torch.randperm(pool_size, generator=step_generator(seed, int(e))) for e in epochs.unique()
    }
    return torch.stack([orders[int(e)][int(p) % pool_size] for e, p in zip(epochs, positions, strict=True)])


@STRATEGIES.register("sft")
class SFTStrategy(RolloutStrategy):
    """The step's (prompt, target) pairs, teacher-forced (module docstring).

    Options: ``train.sft`` (:class:`~genalign.trainers.method_config.SFTConfig`: ``target``, the
    metadata column of the targets; ``image_inputs``); the prompts are rendered with
    ``sampling.language.chat_template`` / ``system_prompt``, as the RL stage renders them.
    """

    rewards_name = "rewards (none: supervised)"

    def __init__(self, config: Any) -> None:
        self.config = config

    def sample(self, context: RolloutContext, step: int) -> RolloutBatch:
        config, pool = self.config, context.prompts
        if not isinstance(pool, PromptPool):
            raise ValueError(
                "train.method 'sft' needs (prompt, target) pairs: give prompts.records or prompts.source"
            )
        targets = pool.require(config.sft.target, f"train.sft.target {config.sft.target!r}")
        size = config.samples_per_step
        indices = epoch_indices(len(pool), config.seed, step * size, size)
        rows = context.local_rows(size)
        local = indices[rows].tolist()
        images = None
        if config.sft.image_inputs:
            images = pool.require("images", "train.sft.image_inputs")[torch.tensor(local)]
        language = context.sampling.language
        settings = TokenSettings(1.0, 1, language.chat_template, language.system_prompt)
        trajectory = teacher_forced_trajectory(
            context.policy, [pool[i] for i in local], [targets[i] for i in local], images, settings
        )
        zeros = torch.zeros(len(local), device=context.device)
        epoch = float((step + 1) * size / len(pool))
        return RolloutBatch(
            trajectory=trajectory,
            rewards=zeros,
            advantages=torch.ones_like(zeros),
            global_index=rows,
            global_batch_size=size,
            global_rewards=torch.zeros(size),
            metrics={"sft_epoch": epoch},
        )

    def assign_advantages(self, batch: RolloutBatch, context: RolloutContext) -> None:
        batch.advantages = torch.ones_like(batch.rewards)  # unused by the sft loss
