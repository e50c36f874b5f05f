"""ReNO (Eyring et al., NeurIPS 2024) for PixArt-alpha DiTs, in particular the one-step PixArt-alpha DMD."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from diffusers import PixArtAlphaPipeline
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import retrieve_timesteps

from genalign.pipelines.guidance import cfg_batch
from genalign.pipelines.reno.common import PromptRequest, ReNOMixin, SamplingSettings

__all__ = ["ReNOPixArtAlphaPipeline"]


class ReNOPixArtAlphaPipeline(ReNOMixin, PixArtAlphaPipeline):
    """ReNO (Eyring et al., NeurIPS 2024) for PixArt-alpha DiTs, in particular the one-step
    PixArt-alpha DMD model (``PixArt-alpha/PixArt-Alpha-DMD-XL-2-512x512``).

    Everything of :class:`~diffusers.PixArtAlphaPipeline`. DMD runs one DDPM step at timestep
    400 and takes the step's ``pred_original_sample`` as the image (the DMD model card and the
    ReNO code; ``PixArtAlphaPipeline`` does the same for one step): with one step and no
    ``timesteps`` this pipeline uses ``[400]``. Learned-sigma outputs keep their mean half.
    CFG runs for ``guidance_scale > 1`` (DMD uses 1, no CFG).
    """

    _denoiser_name = "transformer"
    ONE_STEP_TIMESTEPS = [400]
    """Default schedule for one step: the DMD checkpoint's start timestep."""

    def _encode(self, request: PromptRequest) -> dict[str, Any]:
        do_cfg = request.guidance_scale > 1.0
        with torch.no_grad():
            embeds, mask, negative_embeds, negative_mask = self.encode_prompt(
                request.prompts,
                do_cfg,
                negative_prompt=request.negative_prompt or "",
                num_images_per_prompt=1,
                device=request.device,
                clean_caption=False,
                max_sequence_length=request.max_sequence_length or 120,
            )
        embeds, mask = cfg_batch(negative_embeds, embeds, do_cfg), cfg_batch(negative_mask, mask, do_cfg)
        added_cond_kwargs = {"resolution": None, "aspect_ratio": None}
        if self.transformer.config.sample_size == 128:  # the 1024-px model's size micro-conditions
            height, width, device = request.height, request.width, request.device
            rows = len(request.prompts) * (2 if do_cfg else 1)
            resolution = torch.tensor([height, width]).repeat(rows, 1).to(device, embeds.dtype)
            aspect_ratio = torch.tensor([float(height / width)]).repeat(rows, 1).to(device, embeds.dtype)
            added_cond_kwargs = {"resolution": resolution, "aspect_ratio": aspect_ratio}
        return {"embeds": embeds, "mask": mask, "do_cfg": do_cfg, "added_cond_kwargs": added_cond_kwargs}

    def _schedule(self, settings: SamplingSettings, device: torch.device) -> tuple[torch.Tensor, int]:
        timesteps = settings.timesteps
        if timesteps is None and settings.num_inference_steps == 1:
            timesteps = self.ONE_STEP_TIMESTEPS
        return retrieve_timesteps(self.scheduler, settings.num_inference_steps, device, timesteps)

    def _predict(
        self, model_input: torch.Tensor, t: torch.Tensor, conditioning: Mapping[str, Any]
    ) -> torch.Tensor:
        prediction = self.transformer(
            model_input,
            encoder_hidden_states=conditioning["embeds"],
            encoder_attention_mask=conditioning["mask"],
            timestep=t[None].to(model_input.device).expand(model_input.shape[0]),
            added_cond_kwargs=conditioning["added_cond_kwargs"],
            return_dict=False,
        )[0]
        if self.transformer.config.out_channels // 2 == self.transformer.config.in_channels:
            prediction = prediction.chunk(2, dim=1)[0]  # learned sigma: keep the mean (CFG is per channel)
        return prediction

    def _step_sample(self, step: Any, num_inference_steps: int) -> torch.Tensor:
        if num_inference_steps != 1:
            return step.prev_sample
        # one-step (DMD): the model's x_0 estimate is the image
        sample = getattr(step, "pred_original_sample", None)
        if sample is None:
            raise ValueError(
                f"one-step PixArt needs a scheduler whose step returns pred_original_sample "
                f"(DDPMScheduler, as the DMD checkpoint ships); got {type(self.scheduler).__name__}"
            )
        return sample
