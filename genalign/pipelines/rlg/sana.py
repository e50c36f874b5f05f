"""RLG (Jin et al. 2025) for SANA linear-attention DiTs."""

from __future__ import annotations

import inspect

import torch
from diffusers import SanaPipeline, SanaTransformer2DModel
from diffusers.pipelines.sana.pipeline_sana import (
    ASPECT_RATIO_512_BIN,
    ASPECT_RATIO_1024_BIN,
    ASPECT_RATIO_2048_BIN,
    ASPECT_RATIO_4096_BIN,
)
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import retrieve_timesteps

from genalign.pipelines.guidance import apply_guidance, cfg_batch
from genalign.pipelines.rlg.common import RLGCall, RLGMixin, RLGPipelineOutput, rlg_call

__all__ = ["RLGSanaPipeline"]

_SANA_BINS = {
    128: ASPECT_RATIO_4096_BIN,
    64: ASPECT_RATIO_2048_BIN,
    32: ASPECT_RATIO_1024_BIN,
    16: ASPECT_RATIO_512_BIN,
}
_SANA_INSTRUCTION = inspect.signature(SanaPipeline.__call__).parameters["complex_human_instruction"].default


class RLGSanaPipeline(RLGMixin, SanaPipeline, denoiser="transformer", denoiser_type=SanaTransformer2DModel):
    """RLG (Jin et al. 2025) for SANA linear-attention DiTs (flow matching, Gemma-2 encoder).

    Everything of :class:`~diffusers.SanaPipeline` (resolution binning, the complex human
    instruction prefix, LoRA loading) plus an optional ``rl_transformer`` component.
    """

    __call__ = rlg_call(
        SanaPipeline,
        num_inference_steps=20,
        guidance_scale=4.5,
        negative_prompt="",
        eta=0.0,
        clean_caption=False,
        use_resolution_binning=True,
        max_sequence_length=300,
        complex_human_instruction=_SANA_INSTRUCTION,
    )

    def _binned_size(self, height: int, width: int) -> tuple[int, int]:
        """Resolution binning as ``SanaPipeline``: the nearest size of the model's aspect-ratio bins."""
        sample_size = self.transformer.config.sample_size
        if sample_size not in _SANA_BINS:
            raise ValueError(
                f"resolution binning needs a transformer sample_size in {sorted(_SANA_BINS)}, got {sample_size}; "
                "pass use_resolution_binning=False"
            )
        return self.image_processor.classify_height_width_bin(height, width, ratios=_SANA_BINS[sample_size])

    def _sample(self, call: RLGCall) -> RLGPipelineOutput | tuple:
        # 1. Check inputs (resolution binning as SanaPipeline); default: the native size (1024 px for SANA 1.6B)
        height, width = self._rlg_size(call, self.transformer.config.sample_size)
        orig_height, orig_width = height, width
        if call.use_resolution_binning:
            height, width = self._binned_size(height, width)
        self.check_inputs(call.prompt, height, width, None, call.negative_prompt)
        self._guidance_scale = call.guidance_scale
        self._attention_kwargs = None
        self._interrupt = False
        device = self._execution_device
        do_cfg = call.guidance_scale > 1.0

        # 2. Encode the prompt under each branch: (embeds, attention mask), [uncond; cond] under CFG
        def encode() -> tuple[torch.Tensor, torch.Tensor]:
            positive, mask, negative, negative_mask = self.encode_prompt(
                call.prompt,
                do_cfg,
                negative_prompt=call.negative_prompt,
                num_images_per_prompt=call.num_images_per_prompt,
                device=device,
                clean_caption=call.clean_caption,
                max_sequence_length=call.max_sequence_length,
                complex_human_instruction=call.complex_human_instruction,
            )
            return cfg_batch(negative, positive, do_cfg), cfg_batch(negative_mask, mask, do_cfg)

        branches = self._branches(call.rlg_scale)
        embeds = self._encode_branches(branches, encode)

        # 3. Prepare timesteps, latents and step arguments
        timesteps, _ = retrieve_timesteps(self.scheduler, call.num_inference_steps, device)
        channels = self.transformer.config.in_channels
        latents = self._rlg_latents(call, channels, height, width, torch.float32, device)
        extra_step_kwargs = self.prepare_extra_step_kwargs(call.generator, call.eta)
        transformer_dtype = self.transformer.dtype

        # 4. Denoising loop
        def predict(name: str, denoiser: torch.nn.Module, model_input: torch.Tensor, timestep: torch.Tensor):
            prompt_embeds, prompt_mask = embeds[name]
            prediction = denoiser(
                model_input.to(dtype=transformer_dtype),
                encoder_hidden_states=prompt_embeds.to(dtype=transformer_dtype),
                encoder_attention_mask=prompt_mask,
                timestep=timestep,
                return_dict=False,
                attention_kwargs=self.attention_kwargs,
            )[0]
            prediction = apply_guidance(prediction.float(), call.guidance_scale, do_cfg)
            if self.transformer.config.out_channels // 2 == channels:  # learned sigma: keep the mean
                prediction = prediction.chunk(2, dim=1)[0]
            return prediction

        def model_input(latents: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            batch = cfg_batch(latents, latents, do_cfg)
            return batch, t.expand(batch.shape[0]) * self.transformer.config.timestep_scale

        latents = self._rlg_denoise(
            call, branches, timesteps, latents, predict, model_input, **extra_step_kwargs
        )

        # 5. Decode
        def decode(latents: torch.Tensor) -> object:
            latents = latents.to(self.vae.dtype)
            image = self.vae.decode(latents / self.vae.config.scaling_factor, return_dict=False)[0]
            if call.use_resolution_binning:
                image = self.image_processor.resize_and_crop_tensor(image, orig_width, orig_height)
            return self.image_processor.postprocess(image, output_type=call.output_type)

        return self._rlg_output(call, latents, decode)
