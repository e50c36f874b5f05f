"""VisualQuality-R1's Thurstone fidelity reward against a loop written from the paper's Eqs. 3-4."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from genalign.algorithms import thurstone_fidelity_rewards


def reference(scores, groups, mos, gamma=1e-6, eps=1e-6):
    """Eqs. 3-4 of arXiv 2505.14460 as a plain loop over Python floats (module docstring's rules
    for unparsed scores: reward 0, left out of the statistics)."""
    by_group = {}
    for s, g, m in zip(scores, groups, mos):
        entry = by_group.setdefault(g, {"scores": [], "mos": m})
        if not math.isnan(s):
            entry["scores"].append(s)
    stats = {}
    for g, entry in by_group.items():
        values = entry["scores"]
        if values:
            var = statistics.variance(values) if len(values) > 1 else 0.0
            stats[g] = (statistics.fmean(values), var, entry["mos"])
    out = []
    for s, g, m in zip(scores, groups, mos):
        others = [h for h in stats if h != g]
        if math.isnan(s) or not others:
            out.append(0.0)
            continue
        var_i = stats[g][1]
        total = 0.0
        for h in others:
            mu_j, var_j, mos_j = stats[h]
            p = 0.5 * (1 + math.erf((s - mu_j) / math.sqrt(var_i + var_j + gamma) / math.sqrt(2)))
            truth = 1.0 if m > mos_j else 0.0 if m < mos_j else 0.5
            total += math.sqrt(truth * p + eps) + math.sqrt((1 - truth) * (1 - p) + eps)
        out.append(total / len(others))
    return out


def test_matches_the_paper_loop_with_ties_an_unparsed_score_and_a_single_parsed_score():
    nan = float("nan")
    scores = [3.0, 4.0, nan, 2.0, 2.5, 3.5, 1.0, 1.5, 4.2, nan, nan, 3.3]
    groups = [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 4]
    mos = [5.0, 5.0, 5.0, 3.0, 3.0, 3.0, 3.0, 3.0, 2.0, 2.0, 2.0, 4.0]
    got = thurstone_fidelity_rewards(torch.tensor(scores), torch.tensor(groups), torch.tensor(mos))
    assert got.dtype == torch.float32
    assert got.tolist() == pytest.approx(reference(scores, groups, mos), abs=1e-6)
    assert got[2] == 0 and got[9] == 0  # unparsed completions get the floor


def test_a_score_that_orders_its_image_right_earns_more():
    # image 0 (MOS 5) against image 1 (MOS 2, scores around 2): a high score of image 0 is right
    scores = torch.tensor([4.5, 1.5, 2.0, 2.2])
    groups = torch.tensor([0, 0, 1, 1])
    mos = torch.tensor([5.0, 5.0, 2.0, 2.0])
    rewards = thurstone_fidelity_rewards(scores, groups, mos)
    assert rewards[0] > rewards[1]
    assert 0 < rewards.min() and rewards.max() <= 1 + 2 * math.sqrt(1e-6)
    # equal MOS: the truth is 0.5 and the best score is one at the other image's mean
    tied = thurstone_fidelity_rewards(torch.tensor([3.0, 5.0, 2.9, 3.1]), groups, torch.full((4,), 3.0))
    assert tied[0] > tied[1]


def test_no_comparator_gives_zero_and_bad_input_raises():
    one_group = thurstone_fidelity_rewards(
        torch.tensor([3.0, 4.0]), torch.tensor([0, 0]), torch.tensor([4.0, 4.0])
    )
    assert one_group.tolist() == [0.0, 0.0]
    nothing_parsed_elsewhere = thurstone_fidelity_rewards(
        torch.tensor([3.0, float("nan")]), torch.tensor([0, 1]), torch.tensor([4.0, 2.0])
    )
    assert nothing_parsed_elsewhere.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="one shape"):
        thurstone_fidelity_rewards(torch.tensor([1.0, 2.0]), torch.tensor([0]), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="equal within each group"):
        thurstone_fidelity_rewards(torch.tensor([1.0, 2.0]), torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))
