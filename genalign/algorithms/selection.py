"""Which denoising steps to train on.

Backpropagating through every step of every trajectory is the dominant cost of diffusion RL, so
DDPO (Black et al. 2023, app. B, ``timestep_fraction``) trains each sample on a random subset of
its steps, drawn independently per sample, and Flow-GRPO's code (Liu et al. 2025,
``train.timestep_fraction``) trains on the leading fraction of them. Both keep ``k = fraction * num_steps`` steps; here
``k = max(1, round_half_up(fraction * num_steps))``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

SelectionMode = Literal["random", "first", "last"]

__all__ = ["num_selected_timesteps", "select_timesteps", "select_timesteps_per_sample"]


def num_selected_timesteps(num_steps: int, timestep_fraction: float) -> int:
    """``max(1, round(num_steps * timestep_fraction))`` rounded half up, with the inputs checked."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}")
    if not 0 < timestep_fraction <= 1:
        raise ValueError(f"timestep_fraction must be in (0, 1], got {timestep_fraction}")
    return max(1, min(num_steps, math.floor(num_steps * timestep_fraction + 0.5)))


def select_timesteps(
    num_steps: int,
    timestep_fraction: float,
    generator: torch.Generator | None = None,
    mode: SelectionMode = "random",
) -> torch.Tensor:
    """Indices of the steps to train on, shared by the whole batch.

    Args:
        num_steps: denoising steps in a trajectory.
        timestep_fraction: fraction in ``(0, 1]`` of the steps to keep.
        generator: CPU generator for ``"random"``.
        mode: ``"random"`` (a uniformly random subset), ``"first"`` (the ``k`` noisiest steps,
            Flow-GRPO's choice) or ``"last"``.

    Returns:
        LongTensor ``[k]`` of step indices in ``[0, num_steps)``, increasing, on the CPU.
    """
    k = num_selected_timesteps(num_steps, timestep_fraction)
    if mode == "first":
        return torch.arange(k)
    if mode == "last":
        return torch.arange(num_steps - k, num_steps)
    if mode == "random":
        return torch.randperm(num_steps, generator=generator)[:k].sort().values
    raise ValueError(f"mode must be 'random', 'first' or 'last', got {mode!r}")


def select_timesteps_per_sample(
    batch_size: int,
    num_steps: int,
    timestep_fraction: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """An independent random subset of steps for every sample (DDPO's per-sample permutations).

    Row ``i`` holds the first ``k`` entries of a uniform random permutation of
    ``range(num_steps)``, in that permuted order, as DDPO iterates them: column ``j`` is the step
    each sample trains on at inner iteration ``j``.

    Returns:
        LongTensor ``[batch_size, k]`` on the CPU; each row has distinct entries.
    """
    if batch_size < 0:
        raise ValueError(f"batch_size must be non-negative, got {batch_size}")
    k = num_selected_timesteps(num_steps, timestep_fraction)
    # argsort of i.i.d. uniforms is a uniform random permutation per row.
    keys = torch.rand(batch_size, num_steps, generator=generator)  # [B, T]
    return torch.argsort(keys, dim=1)[:, :k]
