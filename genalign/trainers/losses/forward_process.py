"""Helpers shared by the forward-process losses (DiffusionNFT, RWR, ReFL): seeded noise, the
conditional (unguided) prediction settings, the KL stand-in to the reference model, and a
lagging copy of the trainable parameters (DiffusionNFT's old policy, Astrolabe's reference)
swapped in and saved in checkpoints."""

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
    "load_parameter_copy",
    "parameter_copy_state",
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


def parameter_copy_state(prefix: str, values: Sequence[torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """A lagging copy of the trainable parameters as checkpoint tensors ``{prefix}{i:05d}``."""
    return {f"{prefix}{i:05d}": value.detach().cpu().contiguous() for i, value in enumerate(values or [])}


def load_parameter_copy(
    state: dict[str, torch.Tensor], prefix: str, current: list[torch.Tensor] | None, what: str
) -> list[torch.Tensor] | None:
    """The copy that :func:`parameter_copy_state` saved under ``prefix``: copied into ``current``
    in place (same count, each tensor keeps its device and dtype) or, with no ``current``, cloned;
    ``current`` unchanged when the checkpoint holds none. ``what`` names the copy in the error."""
    values = [state[key] for key in sorted(state) if key.startswith(prefix)]
    if not values:
        return current
    if current is None:
        return [value.clone() for value in values]
    if len(values) != len(current):
        raise ValueError(f"checkpoint holds {len(values)} {what} tensors, expected {len(current)}")
    for target, value in zip(current, values):
        target.copy_(value.to(target.device, target.dtype))
    return current


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
