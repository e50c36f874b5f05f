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
from genalign.pipelines.rlg.common import RLGMixin, RLGPipelineOutput, StepCallback, init_with_rl_denoiser

__all__ = ["RLGSanaPipeline"]

_SANA_BINS = {
    128: ASPECT_RATIO_4096_BIN,
    64: ASPECT_RATIO_2048_BIN,
    32: ASPECT_RATIO_1024_BIN,
    16: ASPECT_RATIO_512_BIN,
}
_SANA_INSTRUCTION = inspect.signature(SanaPipeline.__call__).parameters["complex_human_instruction"].default


class RLGSanaPipeline(RLGMixin, SanaPipeline):
    """RLG (Jin et al. 2025) for SANA linear-attention DiTs (flow matching, Gemma-2 encoder).

    Everything of :class:`~diffusers.SanaPipeline` (resolution binning, the complex human
    instruction prefix, LoRA loading) plus an optional ``rl_transformer`` component.
    """

    _optional_components = [*getattr(SanaPipeline, "_optional_components", []), "rl_transformer"]
    _denoiser_name = "transformer"
    _rl_denoiser_name = "rl_transformer"

    __init__ = init_with_rl_denoiser(SanaPipeline, "rl_transformer", SanaTransformer2DModel)

    def _binned_size(self, height: int, width: int) -> tuple[int, int]:
        """Resolution binning as ``SanaPipeline``: the nearest size of the model's aspect-ratio bins."""
        sample_size = self.transformer.config.sample_size
        if sample_size not in _SANA_BINS:
            raise ValueError(
                f"resolution binning needs a transformer sample_size in {sorted(_SANA_BINS)}, got {sample_size}; "
                "pass use_resolution_binning=False"
            )
        return self.image_processor.classify_height_width_bin(height, width, ratios=_SANA_BINS[sample_size])

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str],
        rlg_scale: float = 1.0,
        num_inference_steps: int = 20,
        guidance_scale: float = 4.5,
        negative_prompt: str | list[str] = "",
        height: int | None = None,
        width: int | None = None,
        num_images_per_prompt: int = 1,
        eta: float = 0.0,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: StepCallback | None = None,
        clean_caption: bool = False,
        use_resolution_binning: bool = True,
        max_sequence_length: int = 300,
        complex_human_instruction: list[str] | None = _SANA_INSTRUCTION,
    ) -> RLGPipelineOutput | tuple:
        """Sample with RLG, ``rlg_scale`` = ``w`` (:class:`RLGMixin`); the rest as ``SanaPipeline``."""
        # 1. Check inputs (resolution binning as SanaPipeline); default: the native size (1024 px for SANA 1.6B)
        self._check_rlg(rlg_scale)
        height = height or self.transformer.config.sample_size * self.vae_scale_factor
        width = width or self.transformer.config.sample_size * self.vae_scale_factor
        orig_height, orig_width = height, width
        if use_resolution_binning:
            height, width = self._binned_size(height, width)
        self.check_inputs(prompt, height, width, None, negative_prompt)
        self._guidance_scale = guidance_scale
        self._attention_kwargs = None
        self._interrupt = False
        batch_size = 1 if isinstance(prompt, str) else len(prompt)
        device = self._execution_device
        do_cfg = guidance_scale > 1.0

        # 2. Encode the prompt under each branch: (embeds, attention mask), [uncond; cond] under CFG
        def encode() -> tuple[torch.Tensor, torch.Tensor]:
            positive, mask, negative, negative_mask = self.encode_prompt(
                prompt,
                do_cfg,
                negative_prompt=negative_prompt,
                num_images_per_prompt=num_images_per_prompt,
                device=device,
                clean_caption=clean_caption,
                max_sequence_length=max_sequence_length,
                complex_human_instruction=complex_human_instruction,
            )
            return cfg_batch(negative, positive, do_cfg), cfg_batch(negative_mask, mask, do_cfg)

        branches = self._branches(rlg_scale)
        embeds = self._encode_branches(branches, encode)

        # 3. Prepare timesteps, latents and step arguments
        timesteps, num_inference_steps = retrieve_timesteps(self.scheduler, num_inference_steps, device)
        channels = self.transformer.config.in_channels
        latents = self.prepare_latents(
            batch_size * num_images_per_prompt,
            channels,
            height,
            width,
            torch.float32,
            device,
            generator,
            latents,
        )
        extra_step_kwargs = self.prepare_extra_step_kwargs(generator, eta)
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
            prediction = apply_guidance(prediction.float(), guidance_scale, do_cfg)
            if self.transformer.config.out_channels // 2 == channels:  # learned sigma: keep the mean
                prediction = prediction.chunk(2, dim=1)[0]
            return prediction

        self._num_timesteps = len(timesteps)
        for i, t in enumerate(timesteps):
            model_input = torch.cat([latents] * 2) if do_cfg else latents
            timestep = t.expand(model_input.shape[0]) * self.transformer.config.timestep_scale
            velocity = self._rlg_prediction(branches, rlg_scale, predict, model_input, timestep)
            latents = self.scheduler.step(velocity, t, latents, **extra_step_kwargs, return_dict=False)[0]
            latents = self._step_end(callback_on_step_end, i, t, latents)

        # 5. Decode
        if output_type == "latent":
            image = latents
        else:
            latents = latents.to(self.vae.dtype)
            image = self.vae.decode(latents / self.vae.config.scaling_factor, return_dict=False)[0]
            if use_resolution_binning:
                image = self.image_processor.resize_and_crop_tensor(image, orig_width, orig_height)
            image = self.image_processor.postprocess(image, output_type=output_type)
        return self._rlg_output(image, return_dict)
