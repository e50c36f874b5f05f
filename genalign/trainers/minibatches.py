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

:func:`epoch_passes` is the generator the trainer's update loop reads: for one inner epoch it
draws the permutation and the step indices each sample trains on, splits the permutation into
minibatches and yields this process's part of each (its local rows, their loss share, and under
FSDP a zero-weighted dummy pass when it holds none of the minibatch's samples), so the update
loop holds no bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from genalign.algorithms import num_selected_timesteps, select_timesteps_per_sample
from genalign.trainers.strategies.base import step_generator

__all__ = [
    "Minibatch",
    "MinibatchPass",
    "epoch_minibatches",
    "epoch_passes",
    "group_permutation",
    "loss_calls",
    "nonzero_advantages",
]


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


@dataclass
class MinibatchPass:
    """This process's part of one minibatch of an inner epoch.

    Attributes:
        rows: local rows of the step's trajectory to run (empty: nothing to run here).
        step_indices: LongTensor ``[len(rows), K]``: row ``i`` trains on ``step_indices[i, k]`` at
            inner iteration ``k``.
        share: the weight of this process's summed per-sample losses, ``len(local) / normaliser``
            (times the process count under FSDP, which averages gradients over processes).
        dummy: a zero-weighted pass on one of this process's own samples: under FSDP every
            process must run the same passes, also one holding no sample of the minibatch.
        optimizer_step: an optimiser step follows this minibatch (every
            ``gradient_accumulation_steps`` minibatches, and after the epoch's last one).
        accumulated: how many minibatches the optimiser step this pass belongs to sums, by which its
            loss is divided: ``gradient_accumulation_steps``, fewer for a short last group of the
            epoch, so that every optimiser step applies the mean over its minibatches (accelerate
            divides by the full count, which shrinks a short last group's step; docs/fidelity.md).
    """

    rows: list[int]
    step_indices: torch.Tensor
    share: float
    dummy: bool
    optimizer_step: bool
    accumulated: int = 1


def group_permutation(
    group_ids: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A permutation of the global batch that keeps each prompt group contiguous (the groups in a
    random order, each group's samples in a random order), and each sample's dense group index.

    Returns ``(permutation [B], group_index [B])``."""
    group_index = torch.unique(group_ids.cpu(), return_inverse=True)[1]
    group_rank = torch.randperm(int(group_index.max()) + 1, generator=generator)
    within = torch.randperm(group_ids.numel(), generator=generator)
    order = group_rank[group_index] * group_ids.numel() + within  # group first, then the random rank
    return torch.argsort(order), group_index


def loss_calls(part: MinibatchPass, fuse: bool) -> list[tuple[list[int], torch.Tensor, float]]:
    """The loss calls of one pass, each ``(rows, step_index [len(rows)], weight)``: the pass's
    gradient is the sum of ``weight * loss(rows at step_index)`` over its calls.

    Unfused: one call per trained step k, ``(rows, step_indices[:, k], share / K)``. Fused
    (``train.fuse_timesteps``): one call on the rows repeated K times, k-major, with every row's
    k-th step, weight ``share``. For a loss that is the mean over its rows of per-row terms the two
    are the same sum: ``share / K * sum_k mean_rows = share * mean over the K x rows``.
    """
    inner = part.step_indices.shape[1]
    if fuse and inner > 1:
        return [(part.rows * inner, part.step_indices.T.reshape(-1), part.share)]
    return [(part.rows, part.step_indices[:, k], part.share / inner) for k in range(inner)]


def nonzero_advantages(
    global_index: torch.Tensor,
    advantages: torch.Tensor,
    global_size: int,
    gather: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device | str,
) -> torch.Tensor:
    """bool ``[B_global]``: whose advantage is not exactly 0, gathered from every process
    (``global_index`` / ``advantages``: this process's ``[B_local]`` positions and advantages)."""
    index = gather(global_index.to(device).long()).cpu()
    nonzero = gather((advantages != 0).to(device).long()).cpu()
    kept = torch.zeros(global_size, dtype=torch.bool)
    kept[index] = nonzero.bool()
    return kept


def epoch_passes(
    train: Any,
    step: int,
    epoch: int,
    global_index: torch.Tensor,
    global_size: int,
    trainable_steps: torch.Tensor,
    kept: torch.Tensor,
    sharded_over: int = 0,
    group_ids: torch.Tensor | None = None,
    num_window_steps: int | None = None,
) -> Iterator[MinibatchPass]:
    """This process's passes of inner epoch ``epoch`` of training step ``step``.

    Args:
        train: the :class:`~genalign.trainers.config.TrainConfig` (seed, minibatch size,
            ``timestep_fraction`` / ``timestep_order``, ``drop_zero_advantage``, accumulation).
        global_index: ``[B_local]`` global position of each local sample.
        global_size: samples in the step's global batch.
        trainable_steps: LongTensor ``[T']`` of the step indices the update may train on.
        kept: bool ``[B_global]`` (:func:`nonzero_advantages`), used under ``drop_zero_advantage``.
        sharded_over: the process count when the denoiser is FSDP-sharded, 0 otherwise.
        group_ids: ``[B_global]`` prompt group of each sample (None: the strategy has none), read
            under ``train.group_noise``: the permutation keeps each group together and its samples
            share their step indices (:func:`group_permutation`).
        num_window_steps: n, the grid steps within the windows; each sample trains
            ``min(int(n * timestep_fraction), T')`` of the trainable steps (None: n = T'), so a
            trajectory whose last step is deterministic (Flow-GRPO's CPS, DDIM with
            ``set_alpha_to_one``) trains as many steps as DDPO's and Flow-GRPO's
            ``int(num_steps * timestep_fraction)``.
    """
    generator = step_generator(train.seed, step, epoch)
    if train.group_noise:
        if group_ids is None:
            raise ValueError(f"train.group_noise: the {train.strategy!r} strategy reports no prompt groups")
        permutation, rows_of = group_permutation(group_ids, generator)  # a group draws its steps once
        draws = int(rows_of.max()) + 1
    else:
        permutation = torch.randperm(global_size, generator=generator)
        rows_of, draws = torch.arange(global_size), global_size  # each sample draws its own steps
    trainable = trainable_steps.numel()
    kept_steps = min(
        trainable, num_selected_timesteps(num_window_steps or trainable, train.timestep_fraction)
    )
    chosen = select_timesteps_per_sample(
        draws, trainable, train.timestep_fraction, generator, train.timestep_order, num_kept=kept_steps
    )[rows_of]
    step_indices = trainable_steps[chosen]  # (B_global, K) actual step indices
    minibatches = epoch_minibatches(
        permutation, train.minibatch_size, kept if train.drop_zero_advantage else None
    )
    local_position = {int(g): i for i, g in enumerate(global_index.tolist())}
    accumulation = train.gradient_accumulation_steps
    count = len(minibatches)
    for m, minibatch in enumerate(minibatches):
        group_start = m - m % accumulation
        members = [int(g) for g in minibatch.members.tolist() if int(g) in local_position]
        share = len(members) / minibatch.normaliser
        dummy = not members and bool(sharded_over)
        if dummy:
            members = [int(global_index[0])]
        if sharded_over:
            share *= sharded_over  # FSDP averages over processes
        yield MinibatchPass(
            rows=[local_position[g] for g in members],
            step_indices=step_indices[torch.tensor(members, dtype=torch.long)],
            share=share,
            dummy=dummy,
            optimizer_step=(m + 1) % accumulation == 0 or m == count - 1,
            accumulated=min(accumulation, count - group_start),
        )
