"""RLG (Jin et al. 2025) for SD3 / SD3.5 flow-matching transformers."""

from __future__ import annotations

import torch
from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import retrieve_timesteps
from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift

from genalign.pipelines.guidance import cfg_batch
from genalign.pipelines.rlg.common import RLGCall, RLGMixin, RLGPipelineOutput, rlg_call

__all__ = ["RLGStableDiffusion3Pipeline"]


class RLGStableDiffusion3Pipeline(
    RLGMixin, StableDiffusion3Pipeline, denoiser="transformer", denoiser_type=SD3Transformer2DModel
):
    """RLG (Jin et al. 2025) for SD3 / SD3.5 flow-matching transformers (FlowMatchEuler).

    Everything of :class:`~diffusers.StableDiffusion3Pipeline` plus an optional
    ``rl_transformer`` component for the two-model form.
    """

    __call__ = rlg_call(
        StableDiffusion3Pipeline, num_inference_steps=28, guidance_scale=7.0, max_sequence_length=256
    )

    def _sample(self, call: RLGCall) -> RLGPipelineOutput | tuple:
        # 1. Check inputs
        height, width = self._checked_t5_size(call, other_prompts=2)
        self._joint_attention_kwargs = None
        device = self._execution_device
        do_cfg = call.guidance_scale > 1

        # 2. Encode the prompt under each branch: (embeds, pooled embeds), [uncond; cond] under CFG
        def encode() -> tuple[torch.Tensor, torch.Tensor]:
            positive, negative, pooled, negative_pooled = self.encode_prompt(
                prompt=call.prompt,
                prompt_2=None,
                prompt_3=None,
                negative_prompt=call.negative_prompt,
                do_classifier_free_guidance=do_cfg,
                device=device,
                num_images_per_prompt=call.num_images_per_prompt,
                max_sequence_length=call.max_sequence_length,
            )
            return cfg_batch(negative, positive, do_cfg), cfg_batch(negative_pooled, pooled, do_cfg)

        branches = self._branches(call.rlg_scale)
        embeds = self._encode_branches(branches, encode)

        # 3. Prepare latents
        dtype = embeds[branches[0][0]][0].dtype
        latents = self._rlg_latents(call, self.transformer.config.in_channels, height, width, dtype, device)

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
        timesteps, _ = retrieve_timesteps(
            self.scheduler, call.num_inference_steps, device, **scheduler_kwargs
        )

        # 5. Denoising loop
        def predict(name: str, denoiser: torch.nn.Module, model_input: torch.Tensor, timestep: torch.Tensor):
            prompt_embeds, pooled_prompt_embeds = embeds[name]
            return self._cfg_prediction(
                call,
                do_cfg,
                denoiser,
                hidden_states=model_input,
                timestep=timestep,
                encoder_hidden_states=prompt_embeds,
                pooled_projections=pooled_prompt_embeds,
            )

        def model_input(latents: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            batch = cfg_batch(latents, latents, do_cfg)
            return batch, t.expand(batch.shape[0])

        latents = self._rlg_denoise(call, branches, timesteps, latents, predict, model_input)

        # 6. Decode
        def decode(latents: torch.Tensor) -> object:
            latents = (latents / self.vae.config.scaling_factor) + self.vae.config.shift_factor
            image = self.vae.decode(latents, return_dict=False)[0]
            return self.image_processor.postprocess(image, output_type=call.output_type)

        return self._rlg_output(call, latents, decode)
