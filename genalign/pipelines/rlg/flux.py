"""RLG (Jin et al. 2025) for FLUX.1 flow transformers (dev and schnell)."""

from __future__ import annotations

import torch
from diffusers import FluxPipeline, FluxTransformer2DModel

from genalign.pipelines.flux_schedule import flux_guidance, flux_timesteps
from genalign.pipelines.guidance import guided_prediction
from genalign.pipelines.rlg.common import RLGCall, RLGMixin, RLGPipelineOutput, rlg_call

__all__ = ["RLGFluxPipeline"]


class RLGFluxPipeline(RLGMixin, FluxPipeline, denoiser="transformer", denoiser_type=FluxTransformer2DModel):
    """RLG (Jin et al. 2025) for FLUX.1 flow transformers (dev and schnell).

    Everything of :class:`~diffusers.FluxPipeline` plus an optional ``rl_transformer``. A
    branch's guided velocity is what ``FluxPipeline`` would step with: FLUX.1-dev's embedded
    guidance (``guidance_scale``, distilled CFG, one pass) and, with ``true_cfg_scale > 1`` and
    a ``negative_prompt``, true CFG ``v_neg + s (v_pos - v_neg)`` on top; RLG then mixes the
    two branches' guided velocities.
    """

    __call__ = rlg_call(
        FluxPipeline, num_inference_steps=28, guidance_scale=3.5, true_cfg_scale=1.0, max_sequence_length=512
    )

    def _sample(self, call: RLGCall) -> RLGPipelineOutput | tuple:
        # 1. Check inputs
        height, width = self._checked_t5_size(call, other_prompts=1)
        self._joint_attention_kwargs = {}
        self._current_timestep = None
        self._interrupt = False
        device = self._execution_device
        do_true_cfg = call.true_cfg_scale > 1 and call.negative_prompt is not None

        # 2. Encode the prompt (and the negative one for true CFG) under each branch
        texts = [call.prompt, call.negative_prompt] if do_true_cfg else [call.prompt]
        branches = self._branches(call.rlg_scale)
        embeds = self._encode_branches(
            branches,
            lambda: [
                self.encode_prompt(
                    prompt=text,
                    prompt_2=None,
                    device=device,
                    num_images_per_prompt=call.num_images_per_prompt,
                    max_sequence_length=call.max_sequence_length,
                )
                for text in texts
            ],
        )

        # 3. Prepare latents (packed) and the flow schedule, as FluxPipeline
        channels, dtype = self.transformer.config.in_channels // 4, embeds[branches[0][0]][0][0].dtype
        latents, image_ids = self._rlg_latents(call, channels, height, width, dtype, device)
        timesteps, _ = flux_timesteps(self.scheduler, call.num_inference_steps, latents.shape[1], device)
        guidance = flux_guidance(self.transformer, call.guidance_scale, latents.shape[0], device)

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
                return guided_prediction(negative, positive, call.true_cfg_scale)
            return velocities[0]

        def model_input(latents: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            self._current_timestep = t  # FluxPipeline's current_timestep, during the step
            return latents, t.expand(latents.shape[0]).to(latents.dtype)

        self.scheduler.set_begin_index(0)
        latents = self._rlg_denoise(call, branches, timesteps, latents, predict, model_input)
        self._current_timestep = None

        # 5. Decode
        def decode(latents: torch.Tensor) -> object:
            latents = self._unpack_latents(latents, height, width, self.vae_scale_factor)
            latents = (latents / self.vae.config.scaling_factor) + self.vae.config.shift_factor
            image = self.vae.decode(latents, return_dict=False)[0]
            return self.image_processor.postprocess(image, output_type=call.output_type)

        return self._rlg_output(call, latents, decode)
