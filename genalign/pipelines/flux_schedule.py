"""FLUX's flow schedule and embedded guidance as ``FluxPipeline`` sets them, shared by the ReNO and
RLG FLUX pipelines."""

from __future__ import annotations

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
from diffusers.pipelines.flux.pipeline_flux import calculate_shift
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import retrieve_timesteps

__all__ = ["flux_guidance", "flux_timesteps"]


def flux_timesteps(
    scheduler: FlowMatchEulerDiscreteScheduler,
    num_inference_steps: int,
    image_seq_len: int,
    device: torch.device,
) -> tuple[torch.Tensor, int]:
    """Sigmas ``linspace(1, 1/n, n)`` (unless the scheduler uses flow sigmas) shifted by the
    resolution-dependent ``mu`` of a packed sequence of ``image_seq_len`` tokens."""
    config = scheduler.config
    sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)
    if getattr(config, "use_flow_sigmas", False):
        sigmas = None
    mu = calculate_shift(
        image_seq_len,
        config.get("base_image_seq_len", 256),
        config.get("max_image_seq_len", 4096),
        config.get("base_shift", 0.5),
        config.get("max_shift", 1.15),
    )
    return retrieve_timesteps(scheduler, num_inference_steps, device, sigmas=sigmas, mu=mu)


def flux_guidance(
    transformer: FluxTransformer2DModel, guidance_scale: float, batch: int, device: torch.device
) -> torch.Tensor | None:
    """FLUX.1-dev's embedded guidance ``[B]`` (a transformer input, not CFG); None for schnell."""
    if not transformer.config.guidance_embeds:
        return None
    guidance = torch.full([1], guidance_scale, device=device, dtype=torch.float32)
    return guidance.expand(batch)
