"""Which denoising steps to train on.

Backpropagating through every step of every trajectory is the dominant cost of diffusion RL, so
DDPO (Black et al. 2023, app. B, ``timestep_fraction``) trains each sample on a random subset of
its steps, drawn independently per sample (``order="random"``), and Flow-GRPO's code (Liu et al.
2025, ``train.timestep_fraction``) trains every sample on the first steps in sampling order, the
noisiest ones (``order="first"``). Both keep ``k = int(num_steps * timestep_fraction)`` steps,
rounded down (ddpo-pytorch's and flow_grpo's ``num_train_timesteps``); here also at least one.
So ``timestep_fraction: 0.99`` with 10 steps trains 9, never the final step to ``sigma = 0``.
"""

from __future__ import annotations

from typing import Literal

import torch

SelectionMode = Literal["random", "first", "last"]
TimestepOrder = Literal["random", "first"]

__all__ = ["num_selected_timesteps", "select_timesteps", "select_timesteps_per_sample"]


def num_selected_timesteps(num_steps: int, timestep_fraction: float) -> int:
    """``max(1, int(num_steps * timestep_fraction))``: floored as DDPO and Flow-GRPO do, inputs checked.

    The product is floored in floating point exactly as the anchors' ``int(...)`` does, so a
    recipe trains the steps its source code trains (``int(100 * 0.29) == 28``, too).
    """
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}")
    if not 0 < timestep_fraction <= 1:
        raise ValueError(f"timestep_fraction must be in (0, 1], got {timestep_fraction}")
    return max(1, min(num_steps, int(num_steps * timestep_fraction)))


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
    order: TimestepOrder = "random",
    num_kept: int | None = None,
) -> torch.Tensor:
    """The steps each sample trains on, one row per sample, ``k = int(num_steps * fraction)``
    (``num_kept``: k given instead, at most ``num_steps``).

    * ``order="random"`` (DDPO, ddpo-pytorch's per-sample ``torch.randperm``): row ``i`` holds the
      first ``k`` entries of a uniform random permutation of ``range(num_steps)``, in that permuted
      order, as DDPO iterates them.
    * ``order="first"`` (Flow-GRPO, flow_grpo's ``for j in range(num_train_timesteps)``): every
      row is ``0, 1, ..., k - 1``, the first ``k`` steps in sampling order; ``generator`` is not
      used.

    Column ``j`` is the step each sample trains on at inner iteration ``j``.

    Returns:
        LongTensor ``[batch_size, k]`` on the CPU; each row has distinct entries.
    """
    if batch_size < 0:
        raise ValueError(f"batch_size must be non-negative, got {batch_size}")
    k = num_selected_timesteps(num_steps, timestep_fraction)
    if num_kept is not None:
        if not 1 <= num_kept <= num_steps:
            raise ValueError(f"num_kept must lie in [1, {num_steps}], got {num_kept}")
        k = num_kept
    if order == "first":
        return torch.arange(k).expand(batch_size, k).clone()  # [B, k]
    if order != "random":
        raise ValueError(f"order must be 'random' or 'first', got {order!r}")
    # argsort of i.i.d. uniforms is a uniform random permutation per row.
    keys = torch.rand(batch_size, num_steps, generator=generator)  # [B, T]
    return torch.argsort(keys, dim=1)[:, :k]
