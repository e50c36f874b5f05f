"""ReNO (Eyring et al., NeurIPS 2024) for FLUX transformers: FLUX.1-schnell and FLUX.1-dev."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from diffusers import FluxPipeline
from diffusers.utils.torch_utils import randn_tensor

from genalign.pipelines.flux_schedule import flux_guidance, flux_timesteps
from genalign.pipelines.reno.common import PromptRequest, ReNOMixin, SamplingSettings

__all__ = ["ReNOFluxPipeline"]


class ReNOFluxPipeline(ReNOMixin, FluxPipeline):
    """ReNO (Eyring et al., NeurIPS 2024) for FLUX transformers: FLUX.1-schnell (1-4 steps,
    no guidance embedding) and FLUX.1-dev (embedded guidance ``guidance_scale``).

    Everything of :class:`~diffusers.FluxPipeline`. The optimised noise is in FLUX's packed
    layout ``[B, h/2 * w/2, 4 C]`` (what ``FluxPipeline`` takes as ``latents``); the norm
    regulariser only sees its elements, so packing does not change it. The flow schedule is
    ``FluxPipeline``'s (sigmas ``linspace(1, 1/n, n)``, resolution shift ``mu``); the Euler
    flow step is differentiable.
    """

    _denoiser_name = "transformer"
    _supports_timesteps = False

    def _default_size(self) -> tuple[int, int]:
        """512 x 512, the only size ReNO's FLUX code runs (its ``main.py`` and ``RewardFlux``),
        not ``FluxPipeline``'s 1024: four times the tokens and the regulariser's dimension."""
        return 512, 512

    def _default_guidance(self) -> float:
        """FLUX.1-dev's embedded guidance as ``FluxPipeline`` defaults it (3.5); 0 for schnell,
        which has no guidance input."""
        return 3.5 if self.transformer.config.guidance_embeds else 0.0

    def _latent_size(self, height: int, width: int) -> tuple[int, int]:
        """Unpacked latent side lengths (even, as packing 2x2 needs), as ``FluxPipeline``."""
        return 2 * (int(height) // (self.vae_scale_factor * 2)), 2 * (
            int(width) // (self.vae_scale_factor * 2)
        )

    def _noise_shape(self, batch: int, height: int, width: int) -> tuple[int, ...]:
        h, w = self._latent_size(height, width)
        return (batch, (h // 2) * (w // 2), self.transformer.config.in_channels)

    def _draw_noise(
        self, batch: int, height: int, width: int, generator: torch.Generator | None, device: Any
    ) -> torch.Tensor:
        # drawn unpacked, then packed, as FluxPipeline.prepare_latents: the same noise for the same generator
        channels = self.transformer.config.in_channels // 4
        h, w = self._latent_size(height, width)
        unpacked = randn_tensor(
            (batch, channels, h, w), generator=generator, device=device, dtype=torch.float32
        )
        return self._pack_latents(unpacked, batch, channels, h, w)

    def _encode(self, request: PromptRequest) -> dict[str, Any]:
        max_sequence_length = request.max_sequence_length
        if max_sequence_length is None:  # schnell's T5 context is 256 tokens, dev's 512
            max_sequence_length = 512 if self.transformer.config.guidance_embeds else 256
        with torch.no_grad():
            embeds, pooled, text_ids = self.encode_prompt(
                prompt=request.prompts,
                prompt_2=None,
                device=request.device,
                num_images_per_prompt=1,
                max_sequence_length=max_sequence_length,
            )
        h, w = self._latent_size(request.height, request.width)
        image_ids = self._prepare_latent_image_ids(
            len(request.prompts), h // 2, w // 2, request.device, embeds.dtype
        )
        return {
            "embeds": embeds,
            "pooled": pooled,
            "text_ids": text_ids,
            "image_ids": image_ids,
            "height": request.height,
            "width": request.width,
        }

    def _denoise(
        self, noise: torch.Tensor, conditioning: Mapping[str, Any], settings: SamplingSettings
    ) -> torch.Tensor:
        """Differentiable flow-matching Euler loop on packed latents ``[B, h/2 * w/2, 4 C]``."""
        if settings.timesteps is not None:
            raise ValueError("timesteps: FLUX sets its flow schedule from num_inference_steps")
        schedule, _ = flux_timesteps(
            self.scheduler, settings.num_inference_steps, noise.shape[1], noise.device
        )
        guidance = flux_guidance(  # FLUX.1-dev: guidance is an input; None for schnell
            self.transformer, settings.guidance_scale, noise.shape[0], noise.device
        )
        self.scheduler.set_begin_index(0)
        latents = noise
        for t in schedule:
            timestep = t.expand(latents.shape[0]).to(latents.dtype)
            velocity = self.transformer(
                hidden_states=latents,
                timestep=timestep / 1000,
                guidance=guidance,
                pooled_projections=conditioning["pooled"],
                encoder_hidden_states=conditioning["embeds"],
                txt_ids=conditioning["text_ids"],
                img_ids=conditioning["image_ids"],
                return_dict=False,
            )[0]
            latents = self.scheduler.step(velocity, t, latents, return_dict=False)[0]
        return latents

    def _decode(self, latents: torch.Tensor, conditioning: Mapping[str, Any]) -> torch.Tensor:
        latents = self._unpack_latents(
            latents, conditioning["height"], conditioning["width"], self.vae_scale_factor
        )
        latents = latents / self.vae.config.scaling_factor + self.vae.config.shift_factor
        image = self.vae.decode(latents.to(self.vae.dtype), return_dict=False)[0]
        return (image / 2 + 0.5).clamp(0, 1)
