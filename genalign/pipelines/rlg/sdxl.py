"""RLG (Jin et al. 2025) for SDXL UNets."""

from __future__ import annotations

import torch
from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import retrieve_timesteps

from genalign.pipelines.decoding import unscale_latents
from genalign.pipelines.guidance import cfg_batch
from genalign.pipelines.rlg.common import RLGCall, RLGMixin, RLGPipelineOutput, rlg_call
from genalign.pipelines.sdxl_conditioning import encode_sdxl_prompt

__all__ = ["RLGStableDiffusionXLPipeline"]


class RLGStableDiffusionXLPipeline(
    RLGMixin, StableDiffusionXLPipeline, denoiser="unet", denoiser_type=UNet2DConditionModel
):
    """RLG (Jin et al. 2025) for SDXL UNets (two CLIP encoders, pooled embeds + ``add_time_ids``).

    Everything of :class:`~diffusers.StableDiffusionXLPipeline` (loading, LoRA loading on the
    UNet and both text encoders, prompt encoding) plus an optional ``rl_unet`` component for
    the two-model form. Size conditioning is original = target = the image size, no crop.
    """

    __call__ = rlg_call(StableDiffusionXLPipeline, num_inference_steps=50, guidance_scale=5.0, eta=0.0)

    def _sample(self, call: RLGCall) -> RLGPipelineOutput | tuple:
        # 1. Check inputs
        height, width = self._rlg_size(call, self.default_sample_size)
        self.check_inputs(call.prompt, None, height, width, None, negative_prompt=call.negative_prompt)
        self._guidance_scale = call.guidance_scale
        self._guidance_rescale = 0.0
        self._clip_skip = None
        self._cross_attention_kwargs = None
        self._denoising_end = None
        self._interrupt = False
        device = self._execution_device
        do_cfg = call.guidance_scale > 1 and self.unet.config.time_cond_proj_dim is None

        # 2. Encode the prompt under each branch (a LoRA may touch both text encoders)
        branches = self._branches(call.rlg_scale)
        conditioning = self._encode_branches(
            branches,
            lambda: encode_sdxl_prompt(
                self,
                call.prompt,
                call.negative_prompt,
                call.num_images_per_prompt,
                do_cfg,
                height,
                width,
                device,
            ),
        )

        # 3. Prepare timesteps, latents and step arguments
        timesteps, _ = retrieve_timesteps(self.scheduler, call.num_inference_steps, device)
        dtype = conditioning[branches[0][0]][0].dtype
        latents = self._rlg_latents(call, self.unet.config.in_channels, height, width, dtype, device)
        extra_step_kwargs = self.prepare_extra_step_kwargs(call.generator, call.eta)
        timestep_cond = self._lcm_timestep_cond(call, device, latents.dtype)  # LCM-SDXL: guidance embedded

        # 4. Denoising loop
        def predict(name: str, denoiser: torch.nn.Module, model_input: torch.Tensor, t: torch.Tensor):
            embeds, added_cond_kwargs = conditioning[name]
            return self._cfg_prediction(
                call,
                do_cfg,
                denoiser,
                model_input,
                t,
                encoder_hidden_states=embeds,
                timestep_cond=timestep_cond,
                added_cond_kwargs=added_cond_kwargs,
            )

        def model_input(latents: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.scheduler.scale_model_input(cfg_batch(latents, latents, do_cfg), t), t

        if hasattr(self.scheduler, "set_begin_index"):
            self.scheduler.set_begin_index(0)
        latents = self._rlg_denoise(
            call, branches, timesteps, latents, predict, model_input, **extra_step_kwargs
        )

        # 5. Decode (fp16 VAEs that need it are upcast, as the SDXL pipeline does)
        def decode(latents: torch.Tensor) -> object:
            needs_upcasting = self.vae.dtype == torch.float16 and self.vae.config.force_upcast
            if needs_upcasting:
                self.upcast_vae()
                latents = latents.to(next(iter(self.vae.post_quant_conv.parameters())).dtype)
            image = self.vae.decode(unscale_latents(self.vae.config, latents), return_dict=False)[0]
            if needs_upcasting:
                self.vae.to(dtype=torch.float16)
            if self.watermark is not None:
                image = self.watermark.apply_watermark(image)
            return self.image_processor.postprocess(image, output_type=call.output_type)

        return self._rlg_output(call, latents, decode)
