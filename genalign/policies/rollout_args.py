"""Rollout arguments: one seeded generator per sample, and the checks every policy's rollout runs
before touching a model (moved out of ``policies/base.py``; re-exported there)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["check_group_size", "per_sample_generators", "validate_rollout_arguments"]


def per_sample_generators(
    batch_size: int,
    generator: torch.Generator | int | None,
    device: torch.device | str,
    seeds: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[torch.Generator]]:
    """One generator per sample, from given ``seeds`` or from seeds drawn off ``generator``."""
    if seeds is None:
        if isinstance(generator, int):
            generator = torch.Generator().manual_seed(generator)
        seeds = torch.randint(0, 2**31 - 1, (batch_size,), generator=generator)
    seeds = torch.as_tensor(seeds, dtype=torch.long).cpu()
    if seeds.shape != (batch_size,):
        raise ValueError(f"seeds must have shape ({batch_size},), got {tuple(seeds.shape)}")
    gens = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
    return seeds, gens


def validate_rollout_arguments(prompts: Sequence[str], num_inference_steps: int, group_size: int) -> None:
    if isinstance(prompts, str):
        raise ValueError("prompts must be a list of strings, not a single string")
    if len(prompts) == 0:
        raise ValueError("prompts is empty: rollout needs at least one prompt")
    if not isinstance(num_inference_steps, int) or num_inference_steps <= 0:
        raise ValueError(f"num_inference_steps must be a positive integer, got {num_inference_steps!r}")
    if not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")


def check_group_size(batch_size: int, group_size: int) -> None:
    """A batch is made of whole prompt groups; say so when it is not."""
    if group_size <= 0:
        raise ValueError(f"group_size must be positive, got {group_size}")
    if batch_size % group_size != 0:
        raise ValueError(
            f"group size {group_size} does not divide the batch size {batch_size}: "
            f"each prompt's group must fit whole in a batch"
        )
