"""RLG (Jin et al. 2025) for SD3 / SD3.5 flow-matching transformers."""

from __future__ import annotations

import torch
from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import retrieve_timesteps
from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift

from genalign.pipelines.guidance import apply_guidance, cfg_batch
from genalign.pipelines.rlg.common import RLGMixin, RLGPipelineOutput, StepCallback, init_with_rl_denoiser

__all__ = ["RLGStableDiffusion3Pipeline"]


class RLGStableDiffusion3Pipeline(RLGMixin, StableDiffusion3Pipeline):
    """RLG (Jin et al. 2025) for SD3 / SD3.5 flow-matching transformers (FlowMatchEuler).

    Everything of :class:`~diffusers.StableDiffusion3Pipeline` plus an optional
    ``rl_transformer`` component for the two-model form.
    """

    _optional_components = [*StableDiffusion3Pipeline._optional_components, "rl_transformer"]
    _denoiser_name = "transformer"
    _rl_denoiser_name = "rl_transformer"

    __init__ = init_with_rl_denoiser(StableDiffusion3Pipeline, "rl_transformer", SD3Transformer2DModel)

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str],
        rlg_scale: float = 1.0,
        num_inference_steps: int = 28,
        guidance_scale: float = 7.0,
        negative_prompt: str | list[str] | None = None,
        height: int | None = None,
        width: int | None = None,
        num_images_per_prompt: int = 1,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: StepCallback | None = None,
        max_sequence_length: int = 256,
    ) -> RLGPipelineOutput | tuple:
        """Sample with RLG, ``rlg_scale`` = ``w`` (:class:`RLGMixin`); the rest as ``StableDiffusion3Pipeline``."""
        # 1. Check inputs
        self._check_rlg(rlg_scale)
        height = height or self.default_sample_size * self.vae_scale_factor
        width = width or self.default_sample_size * self.vae_scale_factor
        self.check_inputs(
            prompt,
            None,
            None,
            height,
            width,
            negative_prompt=negative_prompt,
            max_sequence_length=max_sequence_length,
        )
        self._guidance_scale = guidance_scale
        self._joint_attention_kwargs = None
        batch_size = 1 if isinstance(prompt, str) else len(prompt)
        device = self._execution_device
        do_cfg = guidance_scale > 1

        # 2. Encode the prompt under each branch: (embeds, pooled embeds), [uncond; cond] under CFG
        def encode() -> tuple[torch.Tensor, torch.Tensor]:
            positive, negative, pooled, negative_pooled = self.encode_prompt(
                prompt=prompt,
                prompt_2=None,
                prompt_3=None,
                negative_prompt=negative_prompt,
                do_classifier_free_guidance=do_cfg,
                device=device,
                num_images_per_prompt=num_images_per_prompt,
                max_sequence_length=max_sequence_length,
            )
            return cfg_batch(negative, positive, do_cfg), cfg_batch(negative_pooled, pooled, do_cfg)

        branches = self._branches(rlg_scale)
        embeds = self._encode_branches(branches, encode)

        # 3. Prepare latents
        latents = self.prepare_latents(
            batch_size * num_images_per_prompt,
            self.transformer.config.in_channels,
            height,
            width,
            embeds[branches[0][0]][0].dtype,
            device,
            generator,
            latents,
        )

        # 4. Prepare timesteps (dynamic shifting as SD3's pipeline)
        scheduler_kwargs = {}
        if self.scheduler.config.get("use_dynamic_shifting", None):
            patch = self.transformer.config.patch_size
            image_seq_len = (latents.shape[2] // patch) * (latents.shape[3] // patch)
            scheduler_kwargs["mu"] = calculate_shift(
                image_seq_len,
                self.scheduler.config.get("base_image_seq_len", 256),
                self.scheduler.config.get("max_image_seq_len", 4096),
                self.scheduler.config.get("base_shift", 0.5),
                self.scheduler.config.get("max_shift", 1.16),
            )
        timesteps, num_inference_steps = retrieve_timesteps(
            self.scheduler, num_inference_steps, device, **scheduler_kwargs
        )

        # 5. Denoising loop
        def predict(name: str, denoiser: torch.nn.Module, model_input: torch.Tensor, timestep: torch.Tensor):
            prompt_embeds, pooled_prompt_embeds = embeds[name]
            velocity = denoiser(
                hidden_states=model_input,
                timestep=timestep,
                encoder_hidden_states=prompt_embeds,
                pooled_projections=pooled_prompt_embeds,
                return_dict=False,
            )[0]
            return apply_guidance(velocity, guidance_scale, do_cfg)

        self._num_timesteps = len(timesteps)
        for i, t in enumerate(timesteps):
            model_input = torch.cat([latents] * 2) if do_cfg else latents
            timestep = t.expand(model_input.shape[0])
            velocity = self._rlg_prediction(branches, rlg_scale, predict, model_input, timestep)
            latents = self.scheduler.step(velocity, t, latents, return_dict=False)[0]
            latents = self._step_end(callback_on_step_end, i, t, latents)

        # 6. Decode
        if output_type == "latent":
            image = latents
        else:
            latents = (latents / self.vae.config.scaling_factor) + self.vae.config.shift_factor
            image = self.vae.decode(latents, return_dict=False)[0]
            image = self.image_processor.postprocess(image, output_type=output_type)
        return self._rlg_output(image, return_dict)
