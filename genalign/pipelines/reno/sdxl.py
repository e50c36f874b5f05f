"""ReNO (Eyring et al., NeurIPS 2024) for SDXL UNets: sdxl-turbo, SDXL-LCM, few-step SDXL."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import StableDiffusionXLPipeline

from genalign.pipelines.reno.common import PromptRequest
from genalign.pipelines.reno.unet import UNetReNOMixin, lcm_timestep_cond
from genalign.pipelines.sdxl_conditioning import encode_sdxl_prompt

__all__ = ["ReNOStableDiffusionXLPipeline"]


class ReNOStableDiffusionXLPipeline(UNetReNOMixin, StableDiffusionXLPipeline):
    """ReNO (Eyring et al., NeurIPS 2024) for SDXL UNets: sdxl-turbo (one step, no CFG; the
    paper's setup uses ``EulerAncestralDiscreteScheduler`` with ``timestep_spacing="trailing"``),
    SDXL-LCM, or few-step SDXL with CFG.

    Everything of :class:`~diffusers.StableDiffusionXLPipeline` (loading, LoRA, prompt
    encoding with two CLIP encoders); the UNet gets the pooled text embedding and the
    size/crop ``add_time_ids`` (original = target = the image size, no crop) as the SDXL
    pipeline builds them. Decoding follows the VAE's dtype: in fp16 use a VAE that is stable
    in fp16 (the paper uses ``madebyollin/sdxl-vae-fp16-fix``).
    """

    def _encode(self, request: PromptRequest) -> dict[str, Any]:
        do_cfg = request.guidance_scale > 1.0 and self.unet.config.time_cond_proj_dim is None
        with torch.no_grad():
            embeds, added_cond_kwargs = encode_sdxl_prompt(
                self,
                request.prompts,
                request.negative_prompt,
                1,
                do_cfg,
                request.height,
                request.width,
                request.device,
            )
        return {
            "embeds": embeds,
            "do_cfg": do_cfg,
            "timestep_cond": lcm_timestep_cond(
                self.unet, request.guidance_scale, len(request.prompts), do_cfg
            ),
            "added_cond_kwargs": added_cond_kwargs,
        }

    def _default_size(self) -> tuple[int, int]:
        size = self.default_sample_size * self.vae_scale_factor
        return size, size
