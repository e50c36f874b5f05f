"""VisualQuality-R1's ranking reward: Thurstone comparisons of sampled scores, paid by fidelity.

Wu et al. 2025, "VisualQuality-R1: Reasoning-Induced Image Quality Assessment via Reinforcement
Learning to Rank" (arXiv 2505.14460, NeurIPS 2025; official code ``TianheWu/VisualQuality-R1``
@ a16dcdb, ``src/open-r1-multimodal/src/open_r1/grpo_jsonl.py: accuracy_reward``). A judge samples
G scores ``q_i^(k)`` for each image ``x_i`` of a batch; for every other image ``x_j`` of the batch
the k-th score of ``x_i`` is compared with ``x_j``'s sampled scores under the Thurstone model
(paper, Eq. 3):

    p_ij^(k) = Phi((q_i^(k) - mu_j) / sqrt(sigma_i^2 + sigma_j^2 + gamma)),

``mu``, ``sigma^2`` the mean and unbiased variance of an image's G scores, ``gamma = 1e-6``, and paid
by the fidelity between ``p`` and the ground-truth order ``p*_ij`` (1 if ``MOS_i > MOS_j``, 0 if
lower, 0.5 if equal; paper, Eq. 4):

    r_i^(k) = mean_{j != i} [ sqrt(p*_ij p_ij^(k) + eps) + sqrt((1 - p*_ij)(1 - p_ij^(k)) + eps) ].

A score is paid for ranking its image against the others, not for matching its own MOS: the
reward of a group depends on the other groups of the step.

Where genalign differs from the official function (docs/fidelity.md, "Q-Hawkeye"): a completion
whose answer does not parse gets reward 0 and is left out of its image's mean and variance (the
official draws a random score in [1, 5] for it); an image with no parsed score is not a comparator;
with one parsed score its variance is 0 (the official's ``torch.var`` of one value is NaN).
"""

from __future__ import annotations

import math

import torch

__all__ = ["thurstone_fidelity_rewards"]


def thurstone_fidelity_rewards(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    mos: torch.Tensor,
    gamma: float = 1e-6,
    eps: float = 1e-6,
) -> torch.Tensor:
    """VisualQuality-R1's fidelity reward of each sampled score (module docstring).

    Args:
        scores: ``[B]`` each completion's parsed score (NaN: none parsed).
        group_ids: ``[B]`` the image (group) of each completion.
        mos: ``[B]`` the ground-truth quality of each completion's image (equal within a group).
        gamma: added to the variance sum inside the square root (official 1e-6).
        eps: added inside the fidelity's square roots (official 1e-6).

    Returns:
        ``[B]`` fp32 rewards in about [0, 1]: the mean fidelity against every other image with a
        parsed score; 0 for an unparsed completion, and for every completion when no other image
        of the batch has a parsed score.
    """
    if not (scores.shape == group_ids.shape == mos.shape) or scores.dim() != 1:
        raise ValueError(
            f"scores, group_ids and mos must be [B] tensors of one shape, got "
            f"{tuple(scores.shape)}, {tuple(group_ids.shape)}, {tuple(mos.shape)}"
        )
    scores, mos = scores.double().cpu(), mos.double().cpu()
    groups, inverse = torch.unique(group_ids.cpu(), return_inverse=True)
    parsed = torch.isfinite(scores)
    mean = torch.full((len(groups),), float("nan"), dtype=torch.float64)  # NaN: no parsed score
    var = torch.zeros(len(groups), dtype=torch.float64)
    group_mos = torch.empty(len(groups), dtype=torch.float64)
    for g in range(len(groups)):
        members = inverse == g
        if not torch.allclose(mos[members], mos[members][0].expand(int(members.sum()))):
            raise ValueError("mos must be equal within each group (one image per group)")
        group_mos[g] = mos[members][0]
        valid = scores[members & parsed]
        if valid.numel():
            mean[g] = valid.mean()
            var[g] = valid.var() if valid.numel() > 1 else 0.0  # unbiased, as the official torch.var

    # [B, G]: each completion against each image
    z = (scores[:, None] - mean[None, :]) / torch.sqrt(var[inverse][:, None] + var[None, :] + gamma)
    p = 0.5 * (1.0 + torch.erf(z / math.sqrt(2.0)))
    truth = torch.sign(mos[:, None] - group_mos[None, :]) * 0.5 + 0.5
    fidelity = torch.sqrt(truth * p + eps) + torch.sqrt((1.0 - truth) * (1.0 - p) + eps)
    comparable = mean.isfinite()[None, :] & (inverse[:, None] != torch.arange(len(groups))[None, :])
    total = torch.where(comparable, fidelity, torch.zeros_like(fidelity)).sum(-1)
    others = comparable.sum(-1)
    rewards = torch.where(parsed & (others > 0), total / others.clamp(min=1), torch.zeros_like(total))
    return rewards.float()
