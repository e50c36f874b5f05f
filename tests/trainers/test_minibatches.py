"""Minibatches of an inner epoch, with and without Flow-GRPO's zero-advantage filter."""

from __future__ import annotations

import torch

from genalign.trainers.minibatches import epoch_minibatches


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
    from types import SimpleNamespace

    from genalign.trainers.minibatches import epoch_passes

    train = SimpleNamespace(
        seed=0,
        minibatch_size=4,
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
