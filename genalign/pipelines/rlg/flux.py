"""RLG (Jin et al. 2025) for FLUX.1 flow transformers (dev and schnell)."""

from __future__ import annotations

import torch
from diffusers import FluxPipeline, FluxTransformer2DModel

from genalign.pipelines.flux_schedule import flux_guidance, flux_timesteps
from genalign.pipelines.guidance import guided_prediction
from genalign.pipelines.rlg.common import RLGMixin, RLGPipelineOutput, StepCallback, init_with_rl_denoiser

__all__ = ["RLGFluxPipeline"]


class RLGFluxPipeline(RLGMixin, FluxPipeline):
    """RLG (Jin et al. 2025) for FLUX.1 flow transformers (dev and schnell).

    Everything of :class:`~diffusers.FluxPipeline` plus an optional ``rl_transformer``. A
    branch's guided velocity is what ``FluxPipeline`` would step with: FLUX.1-dev's embedded
    guidance (``guidance_scale``, distilled CFG, one pass) and, with ``true_cfg_scale > 1`` and
    a ``negative_prompt``, true CFG ``v_neg + s (v_pos - v_neg)`` on top; RLG then mixes the
    two branches' guided velocities.
    """

    _optional_components = [*FluxPipeline._optional_components, "rl_transformer"]
    _denoiser_name = "transformer"
    _rl_denoiser_name = "rl_transformer"

    __init__ = init_with_rl_denoiser(FluxPipeline, "rl_transformer", FluxTransformer2DModel)

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str],
        rlg_scale: float = 1.0,
        num_inference_steps: int = 28,
        guidance_scale: float = 3.5,
        negative_prompt: str | list[str] | None = None,
        true_cfg_scale: float = 1.0,
        height: int | None = None,
        width: int | None = None,
        num_images_per_prompt: int = 1,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: StepCallback | None = None,
        max_sequence_length: int = 512,
    ) -> RLGPipelineOutput | tuple:
        """Sample with RLG, ``rlg_scale`` = ``w`` (:class:`RLGMixin`); the rest as ``FluxPipeline``."""
        # 1. Check inputs
        self._check_rlg(rlg_scale)
        height = height or self.default_sample_size * self.vae_scale_factor
        width = width or self.default_sample_size * self.vae_scale_factor
        self.check_inputs(
            prompt,
            None,
            height,
            width,
            negative_prompt=negative_prompt,
            max_sequence_length=max_sequence_length,
        )
        self._guidance_scale = guidance_scale
        self._joint_attention_kwargs = {}
        self._current_timestep = None
        self._interrupt = False
        batch_size = 1 if isinstance(prompt, str) else len(prompt)
        device = self._execution_device
        do_true_cfg = true_cfg_scale > 1 and negative_prompt is not None

        # 2. Encode the prompt (and the negative one for true CFG) under each branch
        texts = [prompt, negative_prompt] if do_true_cfg else [prompt]
        branches = self._branches(rlg_scale)
        embeds = self._encode_branches(
            branches,
            lambda: [
                self.encode_prompt(
                    prompt=text,
                    prompt_2=None,
                    device=device,
                    num_images_per_prompt=num_images_per_prompt,
                    max_sequence_length=max_sequence_length,
                )
                for text in texts
            ],
        )

        # 3. Prepare latents (packed) and the flow schedule, as FluxPipeline
        latents, image_ids = self.prepare_latents(
            batch_size * num_images_per_prompt,
            self.transformer.config.in_channels // 4,
            height,
            width,
            embeds[branches[0][0]][0][0].dtype,
            device,
            generator,
            latents,
        )
        timesteps, num_inference_steps = flux_timesteps(
            self.scheduler, num_inference_steps, latents.shape[1], device
        )
        guidance = flux_guidance(self.transformer, guidance_scale, latents.shape[0], device)

        # 4. Denoising loop
        def predict(name: str, denoiser: torch.nn.Module, latents: torch.Tensor, timestep: torch.Tensor):
            velocities = [
                denoiser(
                    hidden_states=latents,
                    timestep=timestep / 1000,
                    guidance=guidance,
                    pooled_projections=pooled,
                    encoder_hidden_states=prompt_embeds,
                    txt_ids=text_ids,
                    img_ids=image_ids,
                    joint_attention_kwargs=self.joint_attention_kwargs,
                    return_dict=False,
                )[0]
                for prompt_embeds, pooled, text_ids in embeds[name]
            ]
            if do_true_cfg:  # true CFG: v_neg + s (v_pos - v_neg)
                positive, negative = velocities
                return guided_prediction(negative, positive, true_cfg_scale)
            return velocities[0]

        self._num_timesteps = len(timesteps)
        self.scheduler.set_begin_index(0)
        for i, t in enumerate(timesteps):
            self._current_timestep = t
            timestep = t.expand(latents.shape[0]).to(latents.dtype)
            velocity = self._rlg_prediction(branches, rlg_scale, predict, latents, timestep)
            latents = self.scheduler.step(velocity, t, latents, return_dict=False)[0]
            latents = self._step_end(callback_on_step_end, i, t, latents)
        self._current_timestep = None

        # 5. Decode
        if output_type == "latent":
            image = latents
        else:
            latents = self._unpack_latents(latents, height, width, self.vae_scale_factor)
            latents = (latents / self.vae.config.scaling_factor) + self.vae.config.shift_factor
            image = self.vae.decode(latents, return_dict=False)[0]
            image = self.image_processor.postprocess(image, output_type=output_type)
        return self._rlg_output(image, return_dict)
