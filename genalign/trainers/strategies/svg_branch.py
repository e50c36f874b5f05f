"""``train.svg.rollout: branch``: one-token branches off each input's greedy answer.

For each prompt group the policy first writes its greedy answer (the argmax at every token, what
``eval-svg`` decodes), with the log-probs of its tokens at the sampling temperature. Each of the
group's G samples then branches off that answer at one position, drawn with probability
proportional to the alternatives' mass ``1 - pi_T(g_i)``: it copies the answer before the
position, draws a different token there, and finishes greedily
(:class:`~genalign.policies.language_branch.BranchSampler`). Only the branch token is trained
(its ``completion_mask`` is 1 there alone), with advantage ``R(branch) - R(greedy answer)``
(the ``svg`` strategy's greedy baseline, scaled by ``train.advantage_std``). The estimator and its
sources: :mod:`genalign.policies.language_branch`; measured in docs/language.md section 5.4.
"""

from __future__ import annotations

from typing import Any

import torch

from genalign.policies.language_branch import BranchSampler, branch_positions
from genalign.policies.token_trajectory import TokenTrajectory
from genalign.trainers.strategies.base import RolloutContext

__all__ = ["BranchRollout", "branch_token_mask", "group_representatives"]


def group_representatives(group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, answer_of)``: each group's first sample ``[G]``, in order of first appearance, and
    each sample's group as a row of ``first`` ``[B]`` (one answer per group, read back per sample)."""
    groups = group_ids.tolist()
    first: dict[int, int] = {}  # group -> its first sample, in order of first appearance
    for i, g in enumerate(groups):
        first.setdefault(g, i)
    order = {g: k for k, g in enumerate(first)}
    return torch.tensor(list(first.values()), dtype=torch.long), torch.tensor([order[g] for g in groups])


def branch_token_mask(mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``mask`` ``[B, L]`` kept only at each row's branch position (a row at -1 keeps nothing)."""
    columns = torch.arange(mask.shape[1], device=mask.device)
    return mask * (columns[None, :] == positions.to(mask.device)[:, None]).to(mask.dtype)


class BranchRollout:
    """The ``rollout`` of :func:`~genalign.trainers.strategies.base.rollout_indexed_groups` for
    branch rollouts. After a call: ``answers`` (one greedy answer per local group, in order of
    first appearance), ``first`` (each local group's first sample), ``answer_of`` ``[B]`` (each
    sample's row of ``answers``) and ``positions`` ``[B]``."""

    def __init__(self, context: RolloutContext) -> None:
        self.context = context
        self.answers: TokenTrajectory | None = None
        self.first = torch.zeros(0, dtype=torch.long)
        self.answer_of = torch.zeros(0, dtype=torch.long)
        self.positions = torch.zeros(0, dtype=torch.long)

    def __call__(
        self, prompts: list[str], seeds: torch.Tensor, images: Any, group_ids: torch.Tensor
    ) -> TokenTrajectory:
        policy, kwargs = self.context.policy, self.context.rollout_kwargs()
        self.first, self.answer_of = group_representatives(group_ids)
        shown = None if images is None else images[self.first.to(images.device)]
        self.answers = policy.rollout(
            [prompts[i] for i in self.first.tolist()],
            seeds=torch.zeros(len(self.first), dtype=torch.long),
            images=shown,
            sampler=BranchSampler(),
            **kwargs,
        )
        answers = self.answers
        self.positions = branch_positions(
            answers.log_probs[self.answer_of].cpu(), answers.completion_mask[self.answer_of].cpu(), seeds
        )
        branches = policy.rollout(
            prompts,
            seeds=seeds,
            images=images,
            sampler=BranchSampler(
                answers.completion_ids[self.answer_of], self.positions, kwargs["temperature"]
            ),
            **kwargs,
        )
        branches.completion_mask = branch_token_mask(branches.completion_mask, self.positions)
        return branches

    def metrics(self, rewards: torch.Tensor, greedy: torch.Tensor) -> dict[str, float]:
        """The share of branches scoring above / below their greedy answer, and the branch
        position as a fraction of the answer's length (each a local mean, gathered)."""
        context = self.context
        lengths = self.answers.completion_mask.sum(dim=1)[self.answer_of].clamp(min=1).float()
        rows = torch.stack(
            [
                (rewards > greedy).float(),
                (rewards < greedy).float(),
                self.positions.float().to(lengths.device) / lengths,
            ],
            dim=1,
        ).to(context.device)
        better, worse, where = context.gather(rows).mean(dim=0).tolist()
        return {"branch_better_fraction": better, "branch_worse_fraction": worse, "branch_position": where}
