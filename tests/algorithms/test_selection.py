from __future__ import annotations

import pytest
import torch

from genalign.algorithms.selection import (
    num_selected_timesteps,
    select_timesteps,
    select_timesteps_per_sample,
)

# k = int(T * fraction) as ddpo-pytorch and flow_grpo compute ``num_train_timesteps``, at least 1
ANCHOR_COUNTS = [(10, 0.99, 9), (10, 0.5, 5), (20, 0.6, 12), (3, 0.2, 1), (6, 0.99, 5), (10, 0.25, 2),
                 (10, 0.01, 1), (10, 1.0, 10), (3, 0.5, 1), (1, 0.3, 1), (100, 0.29, 28)]  # fmt: skip


@pytest.mark.parametrize("num_steps, fraction, expected", ANCHOR_COUNTS)
def test_count_floors_like_the_anchors_and_keeps_at_least_one(num_steps, fraction, expected):
    assert num_selected_timesteps(num_steps, fraction) == expected


@pytest.mark.parametrize("num_steps, fraction, expected", ANCHOR_COUNTS)
def test_first_order_trains_the_first_k_steps_of_every_sample(num_steps, fraction, expected):
    steps = select_timesteps_per_sample(5, num_steps, fraction, order="first")
    assert steps.dtype == torch.long
    assert steps.tolist() == [list(range(expected))] * 5


@pytest.mark.parametrize("num_steps, fraction, expected", ANCHOR_COUNTS)
def test_random_order_trains_k_distinct_steps_per_sample(num_steps, fraction, expected):
    generator = torch.Generator().manual_seed(num_steps)
    steps = select_timesteps_per_sample(64, num_steps, fraction, generator, order="random")
    assert steps.shape == (64, expected)
    assert all(len(set(row)) == expected and set(row) <= set(range(num_steps)) for row in steps.tolist())
    if expected < num_steps:  # subsets differ between samples
        assert len({tuple(sorted(row)) for row in steps.tolist()}) > 1


def test_unknown_order_is_an_error():
    with pytest.raises(ValueError, match="order"):
        select_timesteps_per_sample(2, 10, 0.5, order="last")


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.01])
def test_fraction_outside_unit_interval_is_an_error(fraction):
    with pytest.raises(ValueError, match=r"timestep_fraction must be in \(0, 1\]"):
        select_timesteps(10, fraction)
    with pytest.raises(ValueError, match="timestep_fraction"):
        select_timesteps_per_sample(2, 10, fraction)


def test_bad_num_steps_and_mode():
    with pytest.raises(ValueError, match="num_steps"):
        select_timesteps(0, 0.5)
    with pytest.raises(ValueError, match="mode"):
        select_timesteps(10, 0.5, mode="middle")


def test_first_and_last():
    assert select_timesteps(10, 0.3, mode="first").tolist() == [0, 1, 2]
    assert select_timesteps(10, 0.3, mode="last").tolist() == [7, 8, 9]
    assert select_timesteps(10, 0.3, mode="first").dtype == torch.long


def test_random_subset_is_sorted_distinct_and_reproducible():
    steps = select_timesteps(20, 0.4, generator=torch.Generator().manual_seed(3))
    assert steps.dtype == torch.long and steps.shape == (8,)
    assert steps.tolist() == sorted(set(steps.tolist()))
    assert 0 <= steps.min() and steps.max() < 20
    again = select_timesteps(20, 0.4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(steps, again)
    assert torch.equal(select_timesteps(20, 1.0), torch.arange(20))


def test_per_sample_rows_are_distinct_uniform_subsets():
    steps = select_timesteps_per_sample(3000, 10, 0.3, generator=torch.Generator().manual_seed(0))
    assert steps.shape == (3000, 3) and steps.dtype == torch.long
    assert all(len(set(row)) == 3 for row in steps.tolist())
    # each step is chosen with probability 3/10: 900 expected picks out of 9000
    counts = torch.bincount(steps.flatten(), minlength=10)
    assert ((counts - 900).abs() < 90).all(), counts
    # samples get different subsets, and a full fraction gives permutations
    assert len({tuple(row) for row in steps[:50].tolist()}) > 1
    full = select_timesteps_per_sample(4, 6, 1.0, generator=torch.Generator().manual_seed(1))
    assert (full.sort(dim=1).values == torch.arange(6)).all()
    reproduced = select_timesteps_per_sample(4, 6, 1.0, generator=torch.Generator().manual_seed(1))
    assert torch.equal(full, reproduced)
