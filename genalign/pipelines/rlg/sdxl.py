"""RLG (Jin et al. 2025) for SDXL UNets."""

from __future__ import annotations

import torch
from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import retrieve_timesteps

from genalign.pipelines.decoding import unscale_latents
from genalign.pipelines.guidance import apply_guidance
from genalign.pipelines.rlg.common import RLGMixin, RLGPipelineOutput, StepCallback, init_with_rl_denoiser
from genalign.pipelines.sdxl_conditioning import encode_sdxl_prompt

__all__ = ["RLGStableDiffusionXLPipeline"]


class RLGStableDiffusionXLPipeline(RLGMixin, StableDiffusionXLPipeline):
    """RLG (Jin et al. 2025) for SDXL UNets (two CLIP encoders, pooled embeds + ``add_time_ids``).

    Everything of :class:`~diffusers.StableDiffusionXLPipeline` (loading, LoRA loading on the
    UNet and both text encoders, prompt encoding) plus an optional ``rl_unet`` component for
    the two-model form. Size conditioning is original = target = the image size, no crop.
    """

    _optional_components = [*StableDiffusionXLPipeline._optional_components, "rl_unet"]
    _denoiser_name = "unet"
    _rl_denoiser_name = "rl_unet"

    __init__ = init_with_rl_denoiser(StableDiffusionXLPipeline, "rl_unet", UNet2DConditionModel)

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str],
        rlg_scale: float = 1.0,
        num_inference_steps: int = 50,
        guidance_scale: float = 5.0,
        negative_prompt: str | list[str] | None = None,
        height: int | None = None,
        width: int | None = None,
        num_images_per_prompt: int = 1,
        eta: float = 0.0,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: StepCallback | None = None,
    ) -> RLGPipelineOutput | tuple:
        """Sample with RLG, ``rlg_scale`` = ``w`` (:class:`RLGMixin`); the rest as ``StableDiffusionXLPipeline``."""
        # 1. Check inputs
        self._check_rlg(rlg_scale)
        height = height or self.default_sample_size * self.vae_scale_factor
        width = width or self.default_sample_size * self.vae_scale_factor
        self.check_inputs(prompt, None, height, width, None, negative_prompt=negative_prompt)
        self._guidance_scale = guidance_scale
        self._guidance_rescale = 0.0
        self._clip_skip = None
        self._cross_attention_kwargs = None
        self._denoising_end = None
        self._interrupt = False
        batch_size = 1 if isinstance(prompt, str) else len(prompt)
        device = self._execution_device
        do_cfg = guidance_scale > 1 and self.unet.config.time_cond_proj_dim is None

        # 2. Encode the prompt under each branch (a LoRA may touch both text encoders)
        branches = self._branches(rlg_scale)
        conditioning = self._encode_branches(
            branches,
            lambda: encode_sdxl_prompt(
                self, prompt, negative_prompt, num_images_per_prompt, do_cfg, height, width, device
            ),
        )

        # 3. Prepare timesteps, latents and step arguments
        timesteps, num_inference_steps = retrieve_timesteps(self.scheduler, num_inference_steps, device)
        latents = self.prepare_latents(
            batch_size * num_images_per_prompt,
            self.unet.config.in_channels,
            height,
            width,
            conditioning[branches[0][0]][0].dtype,
            device,
            generator,
            latents,
        )
        extra_step_kwargs = self.prepare_extra_step_kwargs(generator, eta)
        timestep_cond = None
        if self.unet.config.time_cond_proj_dim is not None:  # LCM-SDXL: guidance as an embedding
            guidance = torch.tensor(guidance_scale - 1).repeat(batch_size * num_images_per_prompt)
            timestep_cond = self.get_guidance_scale_embedding(
                guidance, embedding_dim=self.unet.config.time_cond_proj_dim
            ).to(device=device, dtype=latents.dtype)

        # 4. Denoising loop
        def predict(name: str, denoiser: torch.nn.Module, model_input: torch.Tensor, t: torch.Tensor):
            embeds, added_cond_kwargs = conditioning[name]
            output = denoiser(
                model_input,
                t,
                encoder_hidden_states=embeds,
                timestep_cond=timestep_cond,
                added_cond_kwargs=added_cond_kwargs,
                return_dict=False,
            )[0]
            return apply_guidance(output, guidance_scale, do_cfg)

        self._num_timesteps = len(timesteps)
        if hasattr(self.scheduler, "set_begin_index"):
            self.scheduler.set_begin_index(0)
        for i, t in enumerate(timesteps):
            model_input = torch.cat([latents] * 2) if do_cfg else latents
            model_input = self.scheduler.scale_model_input(model_input, t)
            noise_pred = self._rlg_prediction(branches, rlg_scale, predict, model_input, t)
            latents = self.scheduler.step(noise_pred, t, latents, **extra_step_kwargs, return_dict=False)[0]
            latents = self._step_end(callback_on_step_end, i, t, latents)

        # 5. Decode (fp16 VAEs that need it are upcast, as the SDXL pipeline does)
        if output_type == "latent":
            image = latents
        else:
            needs_upcasting = self.vae.dtype == torch.float16 and self.vae.config.force_upcast
            if needs_upcasting:
                self.upcast_vae()
                latents = latents.to(next(iter(self.vae.post_quant_conv.parameters())).dtype)
            image = self.vae.decode(unscale_latents(self.vae.config, latents), return_dict=False)[0]
            if needs_upcasting:
                self.vae.to(dtype=torch.float16)
            if self.watermark is not None:
                image = self.watermark.apply_watermark(image)
            image = self.image_processor.postprocess(image, output_type=output_type)
        return self._rlg_output(image, return_dict)
