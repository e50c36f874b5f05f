"""The generator of the SD-layout UNets (SD 1.x/2.x, LCM, turbo, SDXL), shared by the ReNO SD and
SDXL pipelines: the pipeline's own scheduler over a UNet, then the KL VAE."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from diffusers import UNet2DConditionModel

from genalign.pipelines.reno.common import ReNOMixin

__all__ = ["UNetReNOMixin", "lcm_guidance_embedding", "lcm_timestep_cond"]


def lcm_guidance_embedding(guidance: torch.Tensor, dim: int) -> torch.Tensor:
    """LCM's sinusoidal embedding of ``w`` (Luo et al. 2023; as diffusers' LCM pipeline)."""
    guidance = guidance * 1000.0
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / (half - 1)))
    emb = guidance.float()[:, None] * freqs[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1)
    if dim % 2 == 1:
        emb = torch.nn.functional.pad(emb, (0, 1))
    return emb


def lcm_timestep_cond(unet: UNet2DConditionModel, guidance_scale: float, batch: int, do_cfg: bool) -> Any:
    """LCM-distilled UNets take ``w - 1`` as a ``timestep_cond`` embedding instead of running CFG."""
    if unet.config.time_cond_proj_dim is None:
        return None
    w = torch.full((batch,), guidance_scale - 1.0)
    cond = lcm_guidance_embedding(w, unet.config.time_cond_proj_dim).to(unet.device, unet.dtype)
    return torch.cat([cond] * 2) if do_cfg else cond


class UNetReNOMixin(ReNOMixin):
    """``G(z)`` for SD-layout UNets: ``conditioning`` holds ``embeds`` (``[uncond; cond]`` under
    CFG), ``do_cfg``, ``timestep_cond`` (LCM) and ``added_cond_kwargs`` (SDXL)."""

    def _predict(
        self, model_input: torch.Tensor, t: torch.Tensor, conditioning: Mapping[str, Any]
    ) -> torch.Tensor:
        return self.unet(
            model_input,
            t,
            encoder_hidden_states=conditioning["embeds"],
            timestep_cond=conditioning.get("timestep_cond"),
            added_cond_kwargs=conditioning.get("added_cond_kwargs"),
            return_dict=False,
        )[0]

    def _default_guidance(self) -> float:
        """An LCM (a UNet with a guidance embedding) takes ``LatentConsistencyModelPipeline``'s
        default w = 8.5; 0 would embed w - 1 = -1, outside what it was distilled for."""
        return 8.5 if self.unet.config.time_cond_proj_dim is not None else 0.0

    def _step_sample(self, step: Any, num_inference_steps: int) -> torch.Tensor:
        # LCM returns the consistency-model estimate of x_0 as ``denoised``
        denoised = getattr(step, "denoised", None)
        return step.prev_sample if denoised is None else denoised
