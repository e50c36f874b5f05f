"""RLG (Jin et al. 2025) for Stable Diffusion 1.x/2.x UNets."""

from __future__ import annotations

import torch
from diffusers import StableDiffusionPipeline, UNet2DConditionModel
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import retrieve_timesteps

from genalign.pipelines.guidance import apply_guidance, cfg_batch
from genalign.pipelines.rlg.common import RLGMixin, RLGPipelineOutput, StepCallback, init_with_rl_denoiser

__all__ = ["RLGStableDiffusionPipeline"]


class RLGStableDiffusionPipeline(RLGMixin, StableDiffusionPipeline):
    """RLG (Jin et al. 2025) for Stable Diffusion 1.x/2.x UNets, any diffusers scheduler.

    Everything of :class:`~diffusers.StableDiffusionPipeline` (loading, LoRA loading, prompt
    encoding) plus an optional ``rl_unet`` component for the two-model form.
    """

    _optional_components = [*StableDiffusionPipeline._optional_components, "rl_unet"]
    _denoiser_name = "unet"
    _rl_denoiser_name = "rl_unet"

    __init__ = init_with_rl_denoiser(
        StableDiffusionPipeline,
        "rl_unet",
        UNet2DConditionModel,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str],
        rlg_scale: float = 1.0,
        num_inference_steps: int = 50,
        guidance_scale: float = 7.5,
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
        """Sample with RLG, ``rlg_scale`` = ``w`` (:class:`RLGMixin`); the rest as ``StableDiffusionPipeline``."""
        # 1. Check inputs
        self._check_rlg(rlg_scale)
        height = height or self.unet.config.sample_size * self.vae_scale_factor
        width = width or self.unet.config.sample_size * self.vae_scale_factor
        self.check_inputs(prompt, height, width, None, negative_prompt)
        self._guidance_scale = guidance_scale
        batch_size = 1 if isinstance(prompt, str) else len(prompt)
        device = self._execution_device
        do_cfg = guidance_scale > 1 and self.unet.config.time_cond_proj_dim is None

        # 2. Encode the prompt under each branch: [uncond; cond] under CFG
        def encode() -> torch.Tensor:
            positive, negative = self.encode_prompt(
                prompt, device, num_images_per_prompt, do_cfg, negative_prompt
            )
            return cfg_batch(negative, positive, do_cfg)

        branches = self._branches(rlg_scale)
        embeds = self._encode_branches(branches, encode)

        # 3. Prepare timesteps
        timesteps, num_inference_steps = retrieve_timesteps(self.scheduler, num_inference_steps, device)

        # 4. Prepare latents and step arguments
        latents = self.prepare_latents(
            batch_size * num_images_per_prompt,
            self.unet.config.in_channels,
            height,
            width,
            embeds[branches[0][0]].dtype,
            device,
            generator,
            latents,
        )
        extra_step_kwargs = self.prepare_extra_step_kwargs(generator, eta)

        # 5. Denoising loop
        def predict(name: str, denoiser: torch.nn.Module, model_input: torch.Tensor, t: torch.Tensor):
            output = denoiser(model_input, t, encoder_hidden_states=embeds[name], return_dict=False)[0]
            return apply_guidance(output, guidance_scale, do_cfg)

        self._num_timesteps = len(timesteps)
        for i, t in enumerate(timesteps):
            model_input = torch.cat([latents] * 2) if do_cfg else latents
            model_input = self.scheduler.scale_model_input(model_input, t)
            noise_pred = self._rlg_prediction(branches, rlg_scale, predict, model_input, t)
            latents = self.scheduler.step(noise_pred, t, latents, **extra_step_kwargs, return_dict=False)[0]
            latents = self._step_end(callback_on_step_end, i, t, latents)

        # 6. Decode
        if output_type == "latent":
            image = latents
        else:
            image = self.vae.decode(
                latents / self.vae.config.scaling_factor, return_dict=False, generator=generator
            )[0]
            image = self.image_processor.postprocess(
                image, output_type=output_type, do_denormalize=[True] * image.shape[0]
            )
        return self._rlg_output(image, return_dict)
