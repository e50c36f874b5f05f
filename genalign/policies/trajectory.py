"""The record of a rollout: everything needed to score it and to recompute its log-probs."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch


def batch_positions(index: torch.Tensor | list[int] | slice, batch_size: int) -> list[int]:
    """The row positions a ``select`` index names: a slice, an index list or tensor, or a boolean
    mask over the ``batch_size`` rows."""
    if isinstance(index, slice):
        return list(range(batch_size))[index]
    if torch.is_tensor(index) and index.dtype == torch.bool:
        return index.nonzero().flatten().tolist()
    return [int(i) for i in (index.tolist() if torch.is_tensor(index) else index)]


@dataclass(frozen=True)
class RolloutSettings:
    """Sampling settings a trajectory was drawn with; log-prob recomputation reuses them exactly.

    ``eta`` is DDIM's stochasticity (sd family), ``noise_level`` and ``mode`` the flow SDE's
    (flow family), ``lcm_schedule`` and ``lcm_final_noise`` the consistency sampler's (its
    timesteps: ``"diffusers"`` or ``"rlcm"``; whether the last step is re-noised and scored, as
    RLCM's code does); a family ignores the settings of the others. ``num_sde_steps``: only the
    first ``num_sde_steps`` steps are stochastic and the rest deterministic (DDIM ``eta = 0``, the
    flow ODE), as PromptRL's generator samples (UniRL's ``--num_sde``); None: every step as
    ``eta`` / ``mode`` say.
    """

    num_inference_steps: int
    guidance_scale: float
    height: int
    width: int
    eta: float = 1.0
    noise_level: float = 0.7
    mode: str = "sde"
    lcm_schedule: str = "diffusers"
    lcm_final_noise: bool = False
    num_sde_steps: int | None = None

    def __post_init__(self) -> None:
        k = self.num_sde_steps
        if k is not None and not 0 <= k <= self.num_inference_steps:
            raise ValueError(f"num_sde_steps must lie in [0, {self.num_inference_steps}], got {k}")

    def at_steps(self, step_index: Any) -> RolloutSettings:
        """The settings the kernel uses at grid steps ``step_index`` (an int or a LongTensor
        ``[B]``): these settings before ``num_sde_steps``, deterministic (``eta = 0``, ``mode =
        "ode"``) from it on. Steps on both sides of it in one call are refused."""
        k = self.num_sde_steps
        if k is None:
            return self
        if torch.is_tensor(step_index):
            low, high = int(step_index.min()), int(step_index.max())
        else:
            low = high = int(step_index)
        if high < k:
            return self
        if low >= k:
            return replace(self, eta=0.0, mode="ode")
        raise ValueError(
            f"steps {low}..{high} straddle num_sde_steps={k}: score SDE and ODE steps separately"
        )


@dataclass
class Trajectory:
    """A batch of B denoising trajectories of T steps.

    Attributes:
        prompts: the B prompts, each group's prompt repeated ``group_size`` times.
        group_ids: ``[B]`` long, the index of each sample's prompt group.
        seeds: ``[B]`` long, the seed of each sample's generator (initial noise and step noise).
        latents: ``[B, T + 1, *latent_shape]``: x_T (the initial noise) ... x_0, in sampling order.
        timesteps: ``[B, T]`` the model timesteps of each step.
        log_probs: ``[B, T]`` fp32 exact log-density of ``latents[:, i + 1]`` given ``latents[:, i]``.
        stds: ``[B, T]`` fp32 standard deviation of each step (0 for a deterministic step, which has
            no density and is never trained on).
        images: ``[B, 3, H, W]`` decoded samples in [0, 1].
        conditioning: per-family prompt conditioning, each tensor ``[B, ...]`` (positive and,
            under classifier-free guidance, ``negative_*`` entries).
        settings: the :class:`RolloutSettings` used.
    """

    prompts: list[str]
    group_ids: torch.Tensor
    seeds: torch.Tensor
    latents: torch.Tensor
    timesteps: torch.Tensor
    log_probs: torch.Tensor
    stds: torch.Tensor
    images: torch.Tensor
    conditioning: dict[str, torch.Tensor]
    settings: RolloutSettings
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return self.latents.shape[0]

    @property
    def num_steps(self) -> int:
        return self.timesteps.shape[1]

    @property
    def outputs(self) -> torch.Tensor:
        """What a reward scores: the decoded images ``[B, 3, H, W]``."""
        return self.images

    def stochastic_steps(self) -> torch.Tensor:
        """Indices of the steps that are stochastic for every sample (the trainable ones)."""
        return (self.stds > 0).all(dim=0).nonzero().flatten().cpu()

    def select(self, index: torch.Tensor | list[int] | slice) -> Trajectory:
        """The sub-batch at ``index`` (a slice, index list or boolean mask over B)."""
        positions = batch_positions(index, self.batch_size)
        rows = torch.tensor(positions, dtype=torch.long)

        def take(value: Any) -> Any:
            if torch.is_tensor(value) and value.ndim > 0 and value.shape[0] == self.batch_size:
                return value[rows.to(value.device)]
            return value

        changes = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "prompts":
                changes[f.name] = [value[i] for i in positions]
            elif isinstance(value, dict):
                changes[f.name] = {k: take(v) for k, v in value.items()}
            elif f.name != "settings":
                changes[f.name] = take(value)
        return replace(self, **changes)

    @staticmethod
    def concat(trajectories: list[Trajectory]) -> Trajectory:
        """Join trajectories drawn with the same settings along the batch dimension."""
        first = trajectories[0]
        if any(t.settings != first.settings for t in trajectories):
            raise ValueError("cannot concatenate trajectories drawn with different settings")
        offset, group_ids = 0, []
        for t in trajectories:
            group_ids.append(t.group_ids + offset)
            offset += int(t.group_ids.max()) + 1 if t.group_ids.numel() else 0
        return Trajectory(
            prompts=[p for t in trajectories for p in t.prompts],
            group_ids=torch.cat(group_ids),
            seeds=torch.cat([t.seeds for t in trajectories]),
            latents=torch.cat([t.latents for t in trajectories]),
            timesteps=torch.cat([t.timesteps for t in trajectories]),
            log_probs=torch.cat([t.log_probs for t in trajectories]),
            stds=torch.cat([t.stds for t in trajectories]),
            images=torch.cat([t.images for t in trajectories]),
            conditioning={
                k: torch.cat([t.conditioning[k] for t in trajectories]) for k in first.conditioning
            },
            settings=first.settings,
            extras=dict(first.extras),
        )
