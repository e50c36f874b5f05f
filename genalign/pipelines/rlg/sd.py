"""RLG (Jin et al. 2025) for Stable Diffusion 1.x/2.x UNets."""

from __future__ import annotations

import torch
from diffusers import StableDiffusionPipeline, UNet2DConditionModel
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import retrieve_timesteps

from genalign.pipelines.guidance import cfg_batch
from genalign.pipelines.rlg.common import RLGCall, RLGMixin, RLGPipelineOutput, rlg_call

__all__ = ["RLGStableDiffusionPipeline"]


class RLGStableDiffusionPipeline(
    RLGMixin,
    StableDiffusionPipeline,
    denoiser="unet",
    denoiser_type=UNet2DConditionModel,
    safety_checker=None,
    feature_extractor=None,
    requires_safety_checker=False,
):
    """RLG (Jin et al. 2025) for Stable Diffusion 1.x/2.x UNets, any diffusers scheduler.

    Everything of :class:`~diffusers.StableDiffusionPipeline` (loading, LoRA loading, prompt
    encoding) plus an optional ``rl_unet`` component for the two-model form.
    """

    __call__ = rlg_call(StableDiffusionPipeline, num_inference_steps=50, guidance_scale=7.5, eta=0.0)

    def _sample(self, call: RLGCall) -> RLGPipelineOutput | tuple:
        # 1. Check inputs
        height, width = self._rlg_size(call, self.unet.config.sample_size)
        self.check_inputs(call.prompt, height, width, None, call.negative_prompt)
        self._guidance_scale = call.guidance_scale
        device = self._execution_device
        do_cfg = call.guidance_scale > 1 and self.unet.config.time_cond_proj_dim is None

        # 2. Encode the prompt under each branch: [uncond; cond] under CFG
        def encode() -> torch.Tensor:
            positive, negative = self.encode_prompt(
                call.prompt, device, call.num_images_per_prompt, do_cfg, call.negative_prompt
            )
            return cfg_batch(negative, positive, do_cfg)

        branches = self._branches(call.rlg_scale)
        embeds = self._encode_branches(branches, encode)

        # 3. Prepare timesteps
        timesteps, _ = retrieve_timesteps(self.scheduler, call.num_inference_steps, device)

        # 4. Prepare latents and step arguments
        dtype = embeds[branches[0][0]].dtype
        latents = self._rlg_latents(call, self.unet.config.in_channels, height, width, dtype, device)
        extra_step_kwargs = self.prepare_extra_step_kwargs(call.generator, call.eta)
        timestep_cond = self._lcm_timestep_cond(call, device, latents.dtype)  # LCM: guidance embedded

        # 5. Denoising loop
        def predict(name: str, denoiser: torch.nn.Module, model_input: torch.Tensor, t: torch.Tensor):
            return self._cfg_prediction(
                call,
                do_cfg,
                denoiser,
                model_input,
                t,
                encoder_hidden_states=embeds[name],
                timestep_cond=timestep_cond,
            )

        def model_input(latents: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.scheduler.scale_model_input(cfg_batch(latents, latents, do_cfg), t), t

        latents = self._rlg_denoise(
            call, branches, timesteps, latents, predict, model_input, **extra_step_kwargs
        )

        # 6. Decode
        def decode(latents: torch.Tensor) -> object:
            image = self.vae.decode(
                latents / self.vae.config.scaling_factor, return_dict=False, generator=call.generator
            )[0]
            return self.image_processor.postprocess(
                image, output_type=call.output_type, do_denormalize=[True] * image.shape[0]
            )

        return self._rlg_output(call, latents, decode)
