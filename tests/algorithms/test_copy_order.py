"""The pair-order reward (genalign's variant for IQA judges): a degraded copy's answer earns 1 when
it is below the mean of its original's answers, against hand-worked cases."""

from __future__ import annotations

import math

import pytest
import torch

from genalign.algorithms import copy_below_original_rewards

NAN = math.nan


def test_hand_worked_groups():
    # group 0: an original answered 4, 3, NaN (mean 3.5); group 1: another original, 2 and 2 (mean 2)
    # group 2: group 0's copy; group 3: group 1's copy
    scores = torch.tensor([4.0, 3.0, NAN, 2.0, 2.0, 3.0, 3.6, NAN, 1.0, 2.0, 2.5])
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 3])
    partner = torch.tensor([-1, -1, -1, -1, -1, 0, 0, 0, 1, 1, 1])
    got = copy_below_original_rewards(scores, groups, partner)
    # originals 0; copy of 0: 3 < 3.5 yes, 3.6 no, unparsed no; copy of 1: 1 < 2 yes, tie no, 2.5 no
    want = torch.tensor([0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0], dtype=torch.float32)
    torch.testing.assert_close(got, want)
    assert got.dtype == torch.float32


def test_scores_are_clamped_to_the_scale_so_going_below_the_floor_earns_nothing():
    scores = torch.tensor([1.0, 1.0, 0.5, -3.0, 6.0, 4.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 3])
    partner = torch.tensor([-1, -1, 0, 0, -1, 2])
    # 0.5 and -3 clamp to 1, a tie with the original's 1; the original 6 clamps to 5, so 4 is below
    torch.testing.assert_close(
        copy_below_original_rewards(scores, groups, partner), torch.tensor([0.0, 0, 0, 0, 0, 1])
    )
    # on a 0-10 scale the same 0.5 and -3 are below 1, and 4 below 6
    torch.testing.assert_close(
        copy_below_original_rewards(scores, groups, partner, 0.0, 10.0), torch.tensor([0.0, 0, 1, 1, 0, 1])
    )


def test_an_original_with_no_parsed_answer_gives_its_copy_nothing():
    scores = torch.tensor([NAN, NAN, 1.0, 2.0])
    got = copy_below_original_rewards(scores, torch.tensor([0, 0, 1, 1]), torch.tensor([-1, -1, 0, 0]))
    torch.testing.assert_close(got, torch.zeros(4))


def test_bad_shapes_and_scales_are_refused():
    with pytest.raises(ValueError, match="one shape"):
        copy_below_original_rewards(torch.zeros(3), torch.zeros(3, dtype=torch.long), torch.zeros(2))
    with pytest.raises(ValueError, match="score_max must exceed"):
        copy_below_original_rewards(torch.zeros(2), torch.zeros(2), torch.zeros(2), 5.0, 1.0)
