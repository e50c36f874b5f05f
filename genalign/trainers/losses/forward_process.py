"""Helpers shared by the forward-process losses (DiffusionNFT, RWR, ReFL): seeded noise, the
conditional (unguided) prediction settings and the KL stand-in to the reference model."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from genalign.policies import DiffusionPolicy

__all__ = [
    "conditional_settings",
    "reference_output_kl",
    "seeded_noise",
    "swapped_trainable_parameters",
    "with_reference_kl",
]


@contextlib.contextmanager
def swapped_trainable_parameters(policy: Any, values: Sequence[torch.Tensor], what: str) -> Iterator[Any]:
    """Within this context the policy's trainable parameters hold ``values`` (a list of tensors
    parallel to ``policy.trainable_parameters()``: DiffusionNFT's old policy, Astrolabe's lagging
    reference, ``what`` names it in the error); the current weights are put back on exit."""
    parameters = policy.trainable_parameters()
    if len(parameters) != len(values):
        raise ValueError(f"the policy has {len(parameters)} trainable tensors, the {what} {len(values)}")
    current = [p.data for p in parameters]
    for parameter, value in zip(parameters, values):
        parameter.data = value
    try:
        yield policy
    finally:
        for parameter, value in zip(parameters, current):
            parameter.data = value


def seeded_noise(
    seeds: torch.Tensor, step_index: torch.Tensor, shape: torch.Size, step: int = 0
) -> torch.Tensor:
    """eps ``[B, *shape]`` (float32, CPU), one generator per sample keyed by (training step, sample
    seed, step index), so N processes draw what one process would and a resumed run draws the same."""
    rows = []
    for seed, index in zip(seeds.tolist(), step_index.tolist()):
        key = ((step * 1_000_003 + int(seed)) * 1_000_003 + int(index) + 1) % (2**63 - 1)
        rows.append(torch.randn(shape, generator=torch.Generator().manual_seed(key), dtype=torch.float32))
    return torch.stack(rows)


def conditional_settings(policy: Any, settings: Any) -> Any:
    """The settings for a conditional (unguided) prediction: guidance 1 unless the guidance scale
    is an input of the denoiser (guidance-distilled FLUX, LCM's w-embedding), where it stays."""
    embedded = bool(getattr(policy, "guidance_embedded", False))
    unet = getattr(getattr(policy, "pipeline", None), "unet", None)
    if unet is not None and getattr(unet.config, "time_cond_proj_dim", None) is not None:
        embedded = True
    return settings if embedded else dataclasses.replace(settings, guidance_scale=1.0)


def reference_output_kl(
    policy: DiffusionPolicy,
    output: torch.Tensor,
    x_t: torch.Tensor,
    step_index: torch.Tensor,
    conditioning: dict[str, torch.Tensor],
    settings: Any,
) -> torch.Tensor:
    """``||f_theta - f_ref||^2`` per sample ``[B]`` (mean over elements): the denoiser's ``output``
    against the reference model's at the same input, the KL stand-in of the forward-process losses."""
    with torch.no_grad(), policy.reference():
        reference = policy.predict(x_t, step_index, conditioning, settings).float()
    return ((output.float() - reference) ** 2).mean(dim=tuple(range(1, output.ndim)))


def with_reference_kl(
    loss: torch.Tensor, metrics: dict[str, torch.Tensor], kl_coef: float, *kl_inputs: Any
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(loss + kl_coef * mean_B KL, metrics with "kl")``, the KL being :func:`reference_output_kl`
    of ``kl_inputs`` (policy, output, x_t, step_index, conditioning, settings); ``(loss, metrics)``
    unchanged, and no reference pass, unless ``kl_coef > 0``."""
    if not kl_coef > 0:
        return loss, metrics
    kl = reference_output_kl(*kl_inputs)  # (B,)
    return loss + kl_coef * kl.mean(), {**metrics, "kl": kl.detach().mean()}
