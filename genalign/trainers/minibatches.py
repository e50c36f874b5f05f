"""The minibatches of one inner epoch: which samples each update sees, and what each one weighs.

The update goes over a permutation of the step's global batch in minibatches; a minibatch's loss is
``sum_i loss_i / normaliser`` over its samples (each process adds its own rows' share and the
gradients are summed across processes).

* Every sample trained (default): consecutive chunks of ``minibatch_size``; ``normaliser =
  minibatch_size``, also for a partial last chunk (a strategy that keeps a variable number of
  samples, B2-DiffuRL's selection, leaves one), so every sample weighs the same.
* Zero-advantage samples dropped (``train.drop_zero_advantage``; Flow-GRPO, Liu et al. 2025,
  ``train_sd3.py``: ``mask = advantages.abs().sum(dim=1) != 0``, then ``samples = samples[mask]``
  before rebatching into ``num_batches_per_epoch`` minibatches): a sample whose advantage is
  exactly 0 (a group whose rewards are all equal, common with 0/1 rewards) carries no policy
  gradient, so it leaves the batch and the loss is the mean over the kept samples only. The kept
  samples are split into as many minibatches as the full batch had (fewer when fewer samples are
  kept), sizes differing by at most one, each normalised by its own size. flow_grpo instead
  re-admits random zero-advantage samples until the kept count divides the number of minibatches
  (per process); the kept samples' weights are the same up to that padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Minibatch", "epoch_minibatches"]


@dataclass
class Minibatch:
    """``members``: LongTensor ``[M]`` of global sample indices; each member's loss is weighted
    ``1 / normaliser``."""

    members: torch.Tensor
    normaliser: int


def epoch_minibatches(
    permutation: torch.Tensor, minibatch_size: int, kept: torch.Tensor | None = None
) -> list[Minibatch]:
    """Split one inner epoch's permuted global batch into minibatches (module docstring).

    Args:
        permutation: LongTensor ``[B]``, a permutation of ``range(B)`` (the global batch).
        minibatch_size: samples per minibatch of the full batch.
        kept: None (train every sample) or bool ``[B]`` indexed by global sample index: the
            samples to train on, the others are dropped.

    Returns:
        The minibatches in update order; empty when no sample is kept.
    """
    num_minibatches = -(-len(permutation) // minibatch_size)
    if kept is None:
        return [
            Minibatch(permutation[m * minibatch_size : (m + 1) * minibatch_size], minibatch_size)
            for m in range(num_minibatches)
        ]
    members = permutation[kept[permutation]]  # the kept samples, in permuted order
    if members.numel() == 0:
        return []
    chunks = torch.tensor_split(members, min(num_minibatches, members.numel()))
    return [Minibatch(chunk, chunk.numel()) for chunk in chunks]
