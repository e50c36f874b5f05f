"""Helpers shared by the svg strategy's tests (imported relatively: ``from .svg_helpers import ...``)."""

from __future__ import annotations

from typing import Any

import torch

# a GRPO step of an SVG recipe on 2 inputs x 4 samples from a pool of 8, one optimiser step
ONE_STEP = (
    "train.num_steps=1",
    "train.prompts_per_step=2",
    "train.group_size=4",
    "train.minibatch_size=8",
    "train.gradient_accumulation_steps=1",
    "prompts.source_kwargs.count=8",
)


def greedy_baseline_advantages(
    rewards: torch.Tensor, greedy: torch.Tensor, group: int, clip: float
) -> torch.Tensor:
    """By hand: each sample's reward minus its group's greedy answer's (``greedy`` ``[B / group]``),
    over the group's population std + 1e-4, clipped to ``[-clip, clip]``; groups are consecutive."""
    spread = rewards.view(-1, group).std(dim=1, unbiased=False)
    want = (rewards - greedy.repeat_interleave(group)) / (spread.repeat_interleave(group) + 1e-4)
    return want.clamp(-clip, clip)


def greedy_answers_by_hand(trainer, **rollout) -> tuple[Any, torch.Tensor]:
    """Step 0's two groups of the svg strategy (the pool rows drawn as it draws them, groups of 4)
    answered by ``trainer.policy.rollout(..., **rollout)`` with seed 0, and the oracle's scores of
    the answers (ShapesEval on the render, in the recipe's mode)."""
    from genalign.rewards import load_reward
    from genalign.rewards.svg import extract_svg_details
    from genalign.trainers.strategies.base import draw_indexed_groups, step_generator

    train = trainer.config.train
    indices, _, _ = draw_indexed_groups(
        len(trainer.prompts), train.prompts_per_step, train.group_size, step_generator(train.seed, 0)
    )
    rows, pool = indices[[0, 4]], trainer.prompts.metadata
    prompts = [trainer.prompts[i] for i in rows.tolist()]
    answers = trainer.policy.rollout(
        prompts,
        seeds=torch.zeros(2, dtype=torch.long),
        images=pool["images"][rows],
        max_new_tokens=64,
        **rollout,
    )
    svgs = [extract_svg_details(text, repair=True).svg or "" for text in answers.completions]
    reward = load_reward("toy_svg_verifier", mode=trainer.config.reward.kwargs["mode"])
    specs = [pool["specs"][i] for i in rows.tolist()]
    return answers, reward(svgs, prompts, specs=specs, targets=pool["images"][rows]).scores
