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
