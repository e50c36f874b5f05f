"""A pair-order reward for IQA judges: score an image's degraded copy below the image itself.

genalign's variant, not part of Q-Hawkeye (Xie et al. 2026, arXiv 2601.22920) nor of
VisualQuality-R1 (arXiv 2505.14460). Q-Hawkeye's accuracy reward compares an answer with its own
image's MOS, so a judge trained on labels that stop at some level learns never to answer below
it, and its answers on a copy degraded further tie with the original's (docs/language.md
section 7, the sixth study). VisualQuality-R1's ranking reward orders images by their MOS; a
degraded copy has no MOS, only a known order: it is worse than the image it was made from.

Each copy is rolled out as a group of its own (its partner is the original's group). A copy's
completion ``k`` with parsed score ``c_k`` earns

    r_k = 1[clamp(c_k) < mean_j clamp(o_j)],

the ``o_j`` the parsed scores of the original's group, both clamped to ``[score_min, score_max]``
(an answer below the scale's floor earns nothing more than the floor). A tie, an unparsed copy
answer and an original group with no parsed answer earn 0. Completions with no partner (the
originals) earn 0: their accuracy term already pays for matching the MOS.
"""

from __future__ import annotations

import torch

__all__ = ["copy_below_original_rewards"]


def copy_below_original_rewards(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    partner_ids: torch.Tensor,
    score_min: float = 1.0,
    score_max: float = 5.0,
) -> torch.Tensor:
    """``[B]`` fp32 rewards in {0, 1} (module docstring).

    Args:
        scores: ``[B]`` each completion's parsed score (NaN: none parsed).
        group_ids: ``[B]`` each completion's group (one image or one copy).
        partner_ids: ``[B]`` for a copy's completion the group id of its original; -1 for the
            originals' completions (no partner, reward 0).
        score_min, score_max: the answer scale both scores are clamped to.
    """
    if not (scores.shape == group_ids.shape == partner_ids.shape) or scores.dim() != 1:
        raise ValueError(
            "scores, group_ids and partner_ids must be [B] tensors of one shape, got "
            f"{tuple(scores.shape)}, {tuple(group_ids.shape)}, {tuple(partner_ids.shape)}"
        )
    if score_max <= score_min:
        raise ValueError(f"score_max must exceed score_min, got [{score_min}, {score_max}]")
    scores = scores.double().cpu().clamp(score_min, score_max)  # NaN stays NaN
    group_ids, partner_ids = group_ids.cpu(), partner_ids.cpu()
    rewards = torch.zeros(scores.shape, dtype=torch.float64)
    for partner in torch.unique(partner_ids[partner_ids >= 0]):
        original = scores[(group_ids == partner) & scores.isfinite()]
        if original.numel() == 0:
            continue
        members = partner_ids == partner
        below = scores[members] < original.mean()  # NaN compares False
        rewards[members] = below.double()
    return rewards.float()
