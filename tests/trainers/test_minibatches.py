"""Minibatches of an inner epoch, with and without Flow-GRPO's zero-advantage filter, and with whole
prompt groups sharing their noise levels (``train.group_noise``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from genalign.trainers.minibatches import epoch_minibatches, epoch_passes, group_permutation
from genalign.trainers.strategies.base import step_generator


def test_every_sample_in_chunks_of_minibatch_size_each_weighing_the_same():
    permutation = torch.tensor([4, 0, 6, 2, 1, 5, 3])
    minibatches = epoch_minibatches(permutation, 3)
    assert [m.members.tolist() for m in minibatches] == [[4, 0, 6], [2, 1, 5], [3]]
    assert [m.normaliser for m in minibatches] == [3, 3, 3]  # the partial last one too


def test_dropped_samples_leave_and_each_minibatch_is_normalised_by_its_kept_samples():
    permutation = torch.tensor([4, 0, 6, 2, 1, 5, 3, 7])
    kept = torch.tensor([True, False, True, True, False, True, True, False])  # drops 1, 4, 7
    minibatches = epoch_minibatches(permutation, 4, kept)
    # flow_grpo: samples[mask] in permuted order, rebatched into the same number of minibatches
    assert [m.members.tolist() for m in minibatches] == [[0, 6, 2], [5, 3]]
    assert [m.normaliser for m in minibatches] == [3, 2]


def test_fewer_kept_samples_than_minibatches_and_none_kept():
    permutation = torch.arange(8)
    kept = torch.zeros(8, dtype=torch.bool)
    kept[5] = True
    minibatches = epoch_minibatches(permutation, 2, kept)
    assert [(m.members.tolist(), m.normaliser) for m in minibatches] == [([5], 1)]
    assert epoch_minibatches(permutation, 2, torch.zeros(8, dtype=torch.bool)) == []


def test_epoch_passes_give_this_process_its_rows_and_fsdp_dummy_passes():
    train = _train(
        seed=0,
        timestep_fraction=1.0,
        timestep_order="first",
        drop_zero_advantage=True,
        gradient_accumulation_steps=2,
    )
    kept = torch.tensor([True, True, False, False])  # only samples 0 and 1 are trained
    steps = torch.tensor([3, 5])
    # process 1 of 2 holds global samples 2 and 3: none is kept, so under FSDP it runs one dummy pass
    (dummy,) = epoch_passes(train, 0, 0, torch.tensor([2, 3]), 4, steps, kept, sharded_over=2)
    assert dummy.dummy and dummy.share == 0.0 and dummy.rows == [0] and dummy.optimizer_step
    assert dummy.step_indices.tolist() == [[3, 5]]
    # without FSDP it runs nothing, but still takes part in the optimiser step
    (empty,) = epoch_passes(train, 0, 0, torch.tensor([2, 3]), 4, steps, kept)
    assert empty.rows == [] and not empty.dummy and empty.optimizer_step
    # process 0 holds both kept samples: one minibatch (of 4 before the filter), normalised by its 2
    (part,) = epoch_passes(train, 0, 0, torch.tensor([0, 1]), 4, steps, kept)
    assert sorted(part.rows) == [0, 1] and part.share == 1.0 and not part.dummy


def _train(group_noise: bool = False, **changes) -> SimpleNamespace:
    options = dict(
        seed=5,
        minibatch_size=4,
        timestep_fraction=0.5,
        timestep_order="random",
        drop_zero_advantage=False,
        gradient_accumulation_steps=1,
        group_noise=group_noise,
        strategy="groups",
    )
    return SimpleNamespace(**(options | changes))


def test_group_permutation_keeps_each_group_together_in_a_random_order():
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    permutation, group_index = group_permutation(group_ids, torch.Generator().manual_seed(0))
    assert sorted(permutation.tolist()) == list(range(12))
    assert torch.equal(group_index, group_ids)
    runs = group_ids[permutation].tolist()
    assert [runs[i : i + 3] for i in range(0, 12, 3)] == [[g] * 3 for g in runs[::3]]  # contiguous
    orders = {
        tuple(group_permutation(group_ids, torch.Generator().manual_seed(s))[0].tolist()) for s in range(6)
    }
    assert len(orders) > 1  # the order of the groups (and within them) is drawn
    # ids need not be 0..G-1: they are mapped to dense indices
    _, dense = group_permutation(torch.tensor([7, 7, 3, 3]), torch.Generator().manual_seed(0))
    assert dense.tolist() == [1, 1, 0, 0]


def test_minibatches_hold_whole_groups_that_share_their_noise_levels():
    group_ids = torch.arange(4).repeat_interleave(4)  # 4 groups of 4, minibatches of 4
    steps = torch.arange(10, 20)
    passes = list(
        epoch_passes(
            _train(True), 3, 0, torch.arange(16), 16, steps, torch.ones(16, dtype=bool), 0, group_ids
        )
    )
    assert len(passes) == 4
    levels = []
    for part in passes:
        assert len(set(group_ids[part.rows].tolist())) == 1 and len(part.rows) == 4
        assert part.step_indices.shape == (4, 5)
        assert (part.step_indices == part.step_indices[0]).all()  # the group's k levels, shared
        levels.append(tuple(part.step_indices[0].tolist()))
    assert len(set(levels)) > 1  # other groups draw other levels


def test_off_the_draws_are_the_per_sample_ones_and_missing_groups_fail_by_name():
    steps = torch.arange(10)
    kept = torch.ones(8, dtype=bool)
    (*parts,) = epoch_passes(_train(False), 2, 1, torch.arange(8), 8, steps, kept, 0, torch.zeros(8))
    generator = step_generator(5, 2, 1)
    permutation = torch.randperm(8, generator=generator)
    keys = torch.rand(8, 10, generator=generator)
    chosen = torch.argsort(keys, dim=1)[:, :5]
    assert [p.rows for p in parts] == [permutation[:4].tolist(), permutation[4:].tolist()]
    assert torch.equal(parts[0].step_indices, chosen[permutation[:4]])
    with pytest.raises(ValueError, match="train.group_noise: the 'groups' strategy reports no prompt groups"):
        list(epoch_passes(_train(True), 0, 0, torch.arange(8), 8, steps, kept, 0, None))


@pytest.mark.parametrize(
    "batch, accumulation, expected",
    [
        (
            20,
            2,
            [(False, 2), (True, 2), (False, 2), (True, 2), (True, 1)],
        ),  # 5 minibatches: a short last group
        (20, 3, [(False, 3), (False, 3), (True, 3), (False, 2), (True, 2)]),
        (16, 2, [(False, 2), (True, 2), (False, 2), (True, 2)]),  # whole groups only
        (8, 4, [(False, 2), (True, 2)]),  # fewer minibatches than the accumulation
    ],
)
def test_each_pass_knows_how_many_minibatches_its_optimiser_step_sums(batch, accumulation, expected):
    """The loss of a pass is divided by its group's minibatch count, not by
    ``gradient_accumulation_steps``: a short last group's step is still the mean over its minibatches."""
    train = _train(gradient_accumulation_steps=accumulation)
    kept = torch.ones(batch, dtype=torch.bool)
    passes = list(epoch_passes(train, 0, 0, torch.arange(batch), batch, torch.arange(4), kept))
    assert [(p.optimizer_step, p.accumulated) for p in passes] == expected
    # the weights of one optimiser step's passes add up to 1 (each minibatch is a mean)
    group, totals = [], []
    for p in passes:
        group.append(1.0 / p.accumulated)
        if p.optimizer_step:
            totals.append(sum(group))
            group = []
    assert totals == pytest.approx([1.0] * len(totals))


@pytest.mark.parametrize(
    ("trainable", "window", "fraction", "expected"),
    [
        (9, 10, 0.99, 9),  # CPS: the last of 10 steps deterministic; flow_grpo trains int(10 x 0.99) = 9
        (9, None, 0.99, 8),  # without the window count: a fraction of the 9 stochastic steps
        (2, 4, 0.5, 2),  # two stochastic steps of 4: int(4 x 0.5) = 2, both
        (2, 10, 0.99, 2),  # never more than the trainable ones
        (8, 8, 0.5, 4),  # every step stochastic (DDPO): int(8 x 0.5), as before
    ],
)
def test_timestep_fraction_is_a_fraction_of_the_grid_steps(trainable, window, fraction, expected):
    train = _train(timestep_fraction=fraction, timestep_order="first")
    steps = torch.arange(trainable)
    kept = torch.ones(4, dtype=torch.bool)
    (part,) = epoch_passes(train, 0, 0, torch.arange(4), 4, steps, kept, 0, None, window)
    assert part.step_indices.tolist() == [list(range(expected))] * 4
