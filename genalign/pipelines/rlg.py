"""RLG: reinforcement learning guidance (Jin et al. 2025).

RL fine-tuning with a KL penalty of strength ``beta`` to a reference model yields the tilted
distribution ``p_RL(x) ∝ p_ref(x) exp(r(x) / beta)``. RLG reads the two models as a CFG pair and
combines their (already classifier-free-guided) predictions with a geometric average,

    v = v_ref + w (v_RL - v_ref)                                   (per step; the paper's RLG update)

which samples ``p_ref^(1 - w) p_RL^w ∝ p_ref exp(w r / beta)``: ``w`` rescales the KL
coefficient to ``beta / w`` at inference, without retraining. ``w = 0`` is the reference model,
``w = 1`` the RL-tuned one, ``w > 1`` extrapolates. ``v`` is whatever the denoiser predicts
(epsilon or v for SD UNets, velocity for flow transformers); both branches run the same CFG
(``guidance_scale``, same negative prompt) before they are combined, as in the paper.

The RL-tuned model is given either as a LoRA on the base pipeline (the reference is the same
model with the adapter disabled: one model in memory) or as a second denoiser ``rl_unet`` /
``rl_transformer``. Families: :class:`RLGStableDiffusionPipeline` (SD 1.x/2.x UNets; DDIM,
Euler, any diffusers scheduler), :class:`RLGStableDiffusionXLPipeline` (SDXL),
:class:`RLGStableDiffusion3Pipeline` (SD3 / SD3.5, flow matching), :class:`RLGFluxPipeline`
(FLUX.1-dev, whose embedded guidance makes each branch's prediction already guided, and
FLUX.1-schnell) and :class:`RLGSanaPipeline` (SANA); :class:`RLGPipeline` picks one.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import PIL.Image
import torch
from diffusers import (
    AutoencoderDC,
    AutoencoderKL,
    DiffusionPipeline,
    DPMSolverMultistepScheduler,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    SanaPipeline,
    SanaTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from diffusers.pipelines.flux.pipeline_flux import calculate_shift as flux_calculate_shift
from diffusers.pipelines.sana.pipeline_sana import (
    ASPECT_RATIO_512_BIN,
    ASPECT_RATIO_1024_BIN,
    ASPECT_RATIO_2048_BIN,
    ASPECT_RATIO_4096_BIN,
)
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import retrieve_timesteps
from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift
from diffusers.schedulers import KarrasDiffusionSchedulers
from diffusers.utils import BaseOutput
from peft.tuners.tuners_utils import BaseTunerLayer
from transformers import (
    CLIPImageProcessor,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
    CLIPVisionModelWithProjection,
    Gemma2PreTrainedModel,
    GemmaTokenizer,
    GemmaTokenizerFast,
    SiglipImageProcessor,
    SiglipVisionModel,
    T5EncoderModel,
    T5TokenizerFast,
)

logger = logging.getLogger(__name__)

__all__ = [
    "RLGPipeline",
    "RLGFluxPipeline",
    "RLGPipelineOutput",
    "RLGSanaPipeline",
    "RLGStableDiffusion3Pipeline",
    "RLGStableDiffusionPipeline",
    "RLGStableDiffusionXLPipeline",
    "rlg_combine",
]


@dataclass
class RLGPipelineOutput(BaseOutput):
    """Output of the RLG pipelines.

    Attributes:
        images: PIL list, ``np.ndarray`` ``[B, H, W, 3]`` or ``torch.Tensor`` ``[B, 3, H, W]``
            (or the final latents for ``output_type="latent"``).
    """

    images: list[PIL.Image.Image] | np.ndarray | torch.Tensor


def rlg_combine(reference: torch.Tensor, rl: torch.Tensor, rlg_scale: float) -> torch.Tensor:
    """RLG's combination (Jin et al. 2025): ``v_ref + w (v_RL - v_ref)``.

    Both inputs are the CFG-guided predictions of one step, same shape. ``w = 0`` returns
    ``reference`` and ``w = 1`` returns ``rl`` exactly (no rounding).
    """
    if rlg_scale == 0.0:
        return reference
    if rlg_scale == 1.0:
        return rl
    return reference + rlg_scale * (rl - reference)


def _cfg(prediction: torch.Tensor, guidance_scale: float, do_cfg: bool) -> torch.Tensor:
    """Classifier-free guidance on a ``[uncond; cond]`` batch: ``u + g (c - u)``."""
    if not do_cfg:
        return prediction
    uncond, cond = prediction.chunk(2)
    return uncond + guidance_scale * (cond - uncond)


class _RLGMixin:
    """Shared RLG machinery: which model is the reference, which the RL-tuned one."""

    _denoiser_name: str
    _rl_denoiser_name: str

    @property
    def rl_denoiser(self) -> torch.nn.Module | None:
        return getattr(self, self._rl_denoiser_name, None)

    def _lora_layers(self) -> list[BaseTunerLayer]:
        """Every peft adapter layer of every component (denoiser and text encoders), however
        it was injected (``load_lora_weights``, ``add_adapter``, ``inject_adapter_in_model``)."""
        return [
            layer
            for name, module in self.components.items()
            if isinstance(module, torch.nn.Module) and name != self._rl_denoiser_name
            for layer in module.modules()
            if isinstance(layer, BaseTunerLayer)
        ]

    def _check_rlg(self, rlg_scale: float) -> None:
        if self.rl_denoiser is None and not self._lora_layers():
            raise ValueError(
                "RLG needs an RL-tuned model: load its LoRA (pipe.load_lora_weights(path)) or pass "
                f"{self._rl_denoiser_name}=... (a second denoiser)"
            )
        if not np.isfinite(rlg_scale):
            raise ValueError(f"rlg_scale must be finite, got {rlg_scale}")

    @contextmanager
    def reference_model(self) -> Iterator[torch.nn.Module]:
        """The reference denoiser: the base model (LoRA disabled on every component) in the LoRA
        form, the pipeline's own denoiser in the two-model form."""
        denoiser = getattr(self, self._denoiser_name)
        if self.rl_denoiser is not None:
            yield denoiser
            return
        layers = [(layer, layer.disable_adapters) for layer in self._lora_layers()]
        for layer, _ in layers:
            layer.enable_adapters(False)  # the layer computes base_layer(x) exactly
        try:
            yield denoiser
        finally:
            for layer, was_disabled in layers:
                layer.enable_adapters(not was_disabled)

    @contextmanager
    def rl_model(self) -> Iterator[torch.nn.Module]:
        """The RL-tuned denoiser (``rl_*`` component, or the denoiser with its LoRA active)."""
        yield self.rl_denoiser if self.rl_denoiser is not None else getattr(self, self._denoiser_name)

    def _branches(self, rlg_scale: float) -> list[tuple[str, Callable]]:
        """The branches to evaluate: w = 0 needs only the reference, w = 1 only the RL model."""
        if rlg_scale == 0.0:
            return [("reference", self.reference_model)]
        if rlg_scale == 1.0:
            return [("rl", self.rl_model)]
        return [("reference", self.reference_model), ("rl", self.rl_model)]


class RLGStableDiffusionPipeline(_RLGMixin, StableDiffusionPipeline):
    """RLG (Jin et al. 2025) for Stable Diffusion 1.x/2.x UNets, any diffusers scheduler.

    Everything of :class:`~diffusers.StableDiffusionPipeline` (loading, LoRA loading, prompt
    encoding) plus an optional ``rl_unet`` component for the two-model form.
    """

    _optional_components = [*StableDiffusionPipeline._optional_components, "rl_unet"]
    _denoiser_name = "unet"
    _rl_denoiser_name = "rl_unet"

    def __init__(
        self,
        vae: AutoencoderKL,
        text_encoder: CLIPTextModel,
        tokenizer: CLIPTokenizer,
        unet: UNet2DConditionModel,
        scheduler: KarrasDiffusionSchedulers,
        safety_checker: StableDiffusionSafetyChecker | None = None,
        feature_extractor: CLIPImageProcessor | None = None,
        image_encoder: CLIPVisionModelWithProjection | None = None,
        requires_safety_checker: bool = False,
        rl_unet: UNet2DConditionModel | None = None,
    ) -> None:
        super().__init__(
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            unet=unet,
            scheduler=scheduler,
            safety_checker=safety_checker,
            feature_extractor=feature_extractor,
            image_encoder=image_encoder,
            requires_safety_checker=requires_safety_checker,
        )
        self.register_modules(rl_unet=rl_unet)

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
        callback_on_step_end: Callable[[DiffusionPipeline, int, int, dict], dict] | None = None,
    ) -> RLGPipelineOutput | tuple:
        """Sample with RLG: per step, CFG in each branch, then ``v_ref + w (v_RL - v_ref)``.

        Args:
            rlg_scale: ``w`` (0: reference model, 1: RL-tuned model, > 1: extrapolation).
            Other arguments as :class:`~diffusers.StableDiffusionPipeline`.
        """
        # 1. Check inputs
        self._check_rlg(rlg_scale)
        height = height or self.unet.config.sample_size * self.vae_scale_factor
        width = width or self.unet.config.sample_size * self.vae_scale_factor
        self.check_inputs(prompt, height, width, None, negative_prompt)
        self._guidance_scale = guidance_scale
        batch_size = 1 if isinstance(prompt, str) else len(prompt)
        device = self._execution_device
        do_cfg = guidance_scale > 1 and self.unet.config.time_cond_proj_dim is None

        # 2. Encode the prompt under each branch (a LoRA may touch the text encoder too)
        branches = self._branches(rlg_scale)
        embeds: dict[str, torch.Tensor] = {}
        for name, model in branches:
            with model():
                positive, negative = self.encode_prompt(
                    prompt, device, num_images_per_prompt, do_cfg, negative_prompt
                )
            embeds[name] = torch.cat([negative, positive]) if do_cfg else positive

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
        self._num_timesteps = len(timesteps)
        for i, t in enumerate(timesteps):
            model_input = torch.cat([latents] * 2) if do_cfg else latents
            model_input = self.scheduler.scale_model_input(model_input, t)
            guided: dict[str, torch.Tensor] = {}
            for name, model in branches:
                with model() as denoiser:
                    prediction = denoiser(
                        model_input, t, encoder_hidden_states=embeds[name], return_dict=False
                    )[0]
                guided[name] = _cfg(prediction, guidance_scale, do_cfg)
            noise_pred = (
                next(iter(guided.values()))
                if len(guided) == 1
                else rlg_combine(guided["reference"], guided["rl"], rlg_scale)
            )
            latents = self.scheduler.step(noise_pred, t, latents, **extra_step_kwargs, return_dict=False)[0]
            if callback_on_step_end is not None:
                outputs = callback_on_step_end(self, i, t, {"latents": latents})
                latents = (outputs or {}).get("latents", latents)

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
        self.maybe_free_model_hooks()
        if not return_dict:
            return (image,)
        return RLGPipelineOutput(images=image)


class RLGStableDiffusion3Pipeline(_RLGMixin, StableDiffusion3Pipeline):
    """RLG (Jin et al. 2025) for SD3 / SD3.5 flow-matching transformers (FlowMatchEuler).

    Everything of :class:`~diffusers.StableDiffusion3Pipeline` plus an optional
    ``rl_transformer`` component for the two-model form.
    """

    _optional_components = [*StableDiffusion3Pipeline._optional_components, "rl_transformer"]
    _denoiser_name = "transformer"
    _rl_denoiser_name = "rl_transformer"

    def __init__(
        self,
        transformer: SD3Transformer2DModel,
        scheduler: FlowMatchEulerDiscreteScheduler,
        vae: AutoencoderKL,
        text_encoder: CLIPTextModelWithProjection,
        tokenizer: CLIPTokenizer,
        text_encoder_2: CLIPTextModelWithProjection,
        tokenizer_2: CLIPTokenizer,
        text_encoder_3: T5EncoderModel | None,
        tokenizer_3: T5TokenizerFast | None,
        image_encoder: SiglipVisionModel | None = None,
        feature_extractor: SiglipImageProcessor | None = None,
        rl_transformer: SD3Transformer2DModel | None = None,
    ) -> None:
        super().__init__(
            transformer=transformer,
            scheduler=scheduler,
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            text_encoder_2=text_encoder_2,
            tokenizer_2=tokenizer_2,
            text_encoder_3=text_encoder_3,
            tokenizer_3=tokenizer_3,
            image_encoder=image_encoder,
            feature_extractor=feature_extractor,
        )
        self.register_modules(rl_transformer=rl_transformer)

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
        callback_on_step_end: Callable[[DiffusionPipeline, int, int, dict], dict] | None = None,
        max_sequence_length: int = 256,
    ) -> RLGPipelineOutput | tuple:
        """Sample with RLG: per step, CFG in each branch, then ``v_ref + w (v_RL - v_ref)``.

        Args:
            rlg_scale: ``w`` (0: reference model, 1: RL-tuned model, > 1: extrapolation).
            Other arguments as :class:`~diffusers.StableDiffusion3Pipeline`.
        """
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

        # 2. Encode the prompt under each branch (a LoRA may touch the text encoders too)
        branches = self._branches(rlg_scale)
        embeds: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for name, model in branches:
            with model():
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
            if do_cfg:
                embeds[name] = (torch.cat([negative, positive]), torch.cat([negative_pooled, pooled]))
            else:
                embeds[name] = (positive, pooled)

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
        self._num_timesteps = len(timesteps)
        for i, t in enumerate(timesteps):
            model_input = torch.cat([latents] * 2) if do_cfg else latents
            timestep = t.expand(model_input.shape[0])
            guided: dict[str, torch.Tensor] = {}
            for name, model in branches:
                prompt_embeds, pooled_prompt_embeds = embeds[name]
                with model() as denoiser:
                    prediction = denoiser(
                        hidden_states=model_input,
                        timestep=timestep,
                        encoder_hidden_states=prompt_embeds,
                        pooled_projections=pooled_prompt_embeds,
                        return_dict=False,
                    )[0]
                guided[name] = _cfg(prediction, guidance_scale, do_cfg)
            velocity = (
                next(iter(guided.values()))
                if len(guided) == 1
                else rlg_combine(guided["reference"], guided["rl"], rlg_scale)
            )
            latents = self.scheduler.step(velocity, t, latents, return_dict=False)[0]
            if callback_on_step_end is not None:
                outputs = callback_on_step_end(self, i, t, {"latents": latents})
                latents = (outputs or {}).get("latents", latents)

        # 6. Decode
        if output_type == "latent":
            image = latents
        else:
            latents = (latents / self.vae.config.scaling_factor) + self.vae.config.shift_factor
            image = self.vae.decode(latents, return_dict=False)[0]
            image = self.image_processor.postprocess(image, output_type=output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return (image,)
        return RLGPipelineOutput(images=image)


class RLGStableDiffusionXLPipeline(_RLGMixin, StableDiffusionXLPipeline):
    """RLG (Jin et al. 2025) for SDXL UNets (two CLIP encoders, pooled embeds + ``add_time_ids``).

    Everything of :class:`~diffusers.StableDiffusionXLPipeline` (loading, LoRA loading on the
    UNet and both text encoders, prompt encoding) plus an optional ``rl_unet`` component for
    the two-model form. Size conditioning is original = target = the image size, no crop.
    """

    _optional_components = [*StableDiffusionXLPipeline._optional_components, "rl_unet"]
    _denoiser_name = "unet"
    _rl_denoiser_name = "rl_unet"

    def __init__(
        self,
        vae: AutoencoderKL,
        text_encoder: CLIPTextModel,
        text_encoder_2: CLIPTextModelWithProjection,
        tokenizer: CLIPTokenizer,
        tokenizer_2: CLIPTokenizer,
        unet: UNet2DConditionModel,
        scheduler: KarrasDiffusionSchedulers,
        image_encoder: CLIPVisionModelWithProjection | None = None,
        feature_extractor: CLIPImageProcessor | None = None,
        force_zeros_for_empty_prompt: bool = True,
        add_watermarker: bool | None = None,
        rl_unet: UNet2DConditionModel | None = None,
    ) -> None:
        super().__init__(
            vae=vae,
            text_encoder=text_encoder,
            text_encoder_2=text_encoder_2,
            tokenizer=tokenizer,
            tokenizer_2=tokenizer_2,
            unet=unet,
            scheduler=scheduler,
            image_encoder=image_encoder,
            feature_extractor=feature_extractor,
            force_zeros_for_empty_prompt=force_zeros_for_empty_prompt,
            add_watermarker=add_watermarker,
        )
        self.register_modules(rl_unet=rl_unet)

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
        callback_on_step_end: Callable[[DiffusionPipeline, int, int, dict], dict] | None = None,
    ) -> RLGPipelineOutput | tuple:
        """Sample with RLG: per step, CFG in each branch, then ``v_ref + w (v_RL - v_ref)``.

        Args:
            rlg_scale: ``w`` (0: reference model, 1: RL-tuned model, > 1: extrapolation).
            Other arguments as :class:`~diffusers.StableDiffusionXLPipeline`.
        """
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
        conditioning: dict[str, tuple[torch.Tensor, dict[str, torch.Tensor]]] = {}
        for name, model in branches:
            with model():
                positive, negative, pooled, negative_pooled = self.encode_prompt(
                    prompt=prompt,
                    device=device,
                    num_images_per_prompt=num_images_per_prompt,
                    do_classifier_free_guidance=do_cfg,
                    negative_prompt=negative_prompt,
                )
            projection_dim = (
                int(pooled.shape[-1])
                if self.text_encoder_2 is None
                else self.text_encoder_2.config.projection_dim
            )
            time_ids = self._get_add_time_ids(
                (height, width),
                (0, 0),
                (height, width),
                dtype=positive.dtype,
                text_encoder_projection_dim=projection_dim,
            )
            if do_cfg:
                positive = torch.cat([negative, positive], dim=0)
                pooled = torch.cat([negative_pooled, pooled], dim=0)
                time_ids = torch.cat([time_ids, time_ids], dim=0)
            time_ids = time_ids.to(device).repeat(batch_size * num_images_per_prompt, 1)
            conditioning[name] = (
                positive.to(device),
                {"text_embeds": pooled.to(device), "time_ids": time_ids},
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
        self._num_timesteps = len(timesteps)
        if hasattr(self.scheduler, "set_begin_index"):
            self.scheduler.set_begin_index(0)
        for i, t in enumerate(timesteps):
            model_input = torch.cat([latents] * 2) if do_cfg else latents
            model_input = self.scheduler.scale_model_input(model_input, t)
            guided: dict[str, torch.Tensor] = {}
            for name, model in branches:
                embeds, added_cond_kwargs = conditioning[name]
                with model() as denoiser:
                    prediction = denoiser(
                        model_input,
                        t,
                        encoder_hidden_states=embeds,
                        timestep_cond=timestep_cond,
                        added_cond_kwargs=added_cond_kwargs,
                        return_dict=False,
                    )[0]
                guided[name] = _cfg(prediction, guidance_scale, do_cfg)
            noise_pred = (
                next(iter(guided.values()))
                if len(guided) == 1
                else rlg_combine(guided["reference"], guided["rl"], rlg_scale)
            )
            latents = self.scheduler.step(noise_pred, t, latents, **extra_step_kwargs, return_dict=False)[0]
            if callback_on_step_end is not None:
                outputs = callback_on_step_end(self, i, t, {"latents": latents})
                latents = (outputs or {}).get("latents", latents)

        # 5. Decode (fp16 VAEs that need it are upcast, as the SDXL pipeline does)
        if output_type == "latent":
            image = latents
        else:
            needs_upcasting = self.vae.dtype == torch.float16 and self.vae.config.force_upcast
            if needs_upcasting:
                self.upcast_vae()
                latents = latents.to(next(iter(self.vae.post_quant_conv.parameters())).dtype)
            config = self.vae.config
            mean, std = getattr(config, "latents_mean", None), getattr(config, "latents_std", None)
            if mean is not None and std is not None:
                mean = torch.tensor(mean).view(1, 4, 1, 1).to(latents.device, latents.dtype)
                std = torch.tensor(std).view(1, 4, 1, 1).to(latents.device, latents.dtype)
                latents = latents * std / config.scaling_factor + mean
            else:
                latents = latents / config.scaling_factor
            image = self.vae.decode(latents, return_dict=False)[0]
            if needs_upcasting:
                self.vae.to(dtype=torch.float16)
            if self.watermark is not None:
                image = self.watermark.apply_watermark(image)
            image = self.image_processor.postprocess(image, output_type=output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return (image,)
        return RLGPipelineOutput(images=image)


class RLGFluxPipeline(_RLGMixin, FluxPipeline):
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

    def __init__(
        self,
        scheduler: FlowMatchEulerDiscreteScheduler,
        vae: AutoencoderKL,
        text_encoder: CLIPTextModel,
        tokenizer: CLIPTokenizer,
        text_encoder_2: T5EncoderModel,
        tokenizer_2: T5TokenizerFast,
        transformer: FluxTransformer2DModel,
        image_encoder: CLIPVisionModelWithProjection | None = None,
        feature_extractor: CLIPImageProcessor | None = None,
        rl_transformer: FluxTransformer2DModel | None = None,
    ) -> None:
        super().__init__(
            scheduler=scheduler,
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            text_encoder_2=text_encoder_2,
            tokenizer_2=tokenizer_2,
            transformer=transformer,
            image_encoder=image_encoder,
            feature_extractor=feature_extractor,
        )
        self.register_modules(rl_transformer=rl_transformer)

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
        callback_on_step_end: Callable[[DiffusionPipeline, int, int, dict], dict] | None = None,
        max_sequence_length: int = 512,
    ) -> RLGPipelineOutput | tuple:
        """Sample with RLG: per step, guidance in each branch, then ``v_ref + w (v_RL - v_ref)``.

        Args:
            rlg_scale: ``w`` (0: reference model, 1: RL-tuned model, > 1: extrapolation).
            Other arguments as :class:`~diffusers.FluxPipeline`.
        """
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

        # 2. Encode the prompt under each branch (a LoRA may touch the text encoders too)
        branches = self._branches(rlg_scale)
        embeds: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
        for name, model in branches:
            with model():
                texts = [prompt, negative_prompt] if do_true_cfg else [prompt]
                embeds[name] = [
                    self.encode_prompt(
                        prompt=text,
                        prompt_2=None,
                        device=device,
                        num_images_per_prompt=num_images_per_prompt,
                        max_sequence_length=max_sequence_length,
                    )
                    for text in texts
                ]

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
        sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)
        if getattr(self.scheduler.config, "use_flow_sigmas", False):
            sigmas = None
        mu = flux_calculate_shift(
            latents.shape[1],
            self.scheduler.config.get("base_image_seq_len", 256),
            self.scheduler.config.get("max_image_seq_len", 4096),
            self.scheduler.config.get("base_shift", 0.5),
            self.scheduler.config.get("max_shift", 1.15),
        )
        timesteps, num_inference_steps = retrieve_timesteps(
            self.scheduler, num_inference_steps, device, sigmas=sigmas, mu=mu
        )
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full([1], guidance_scale, device=device, dtype=torch.float32)
            guidance = guidance.expand(latents.shape[0])

        # 4. Denoising loop
        self._num_timesteps = len(timesteps)
        self.scheduler.set_begin_index(0)
        for i, t in enumerate(timesteps):
            self._current_timestep = t
            timestep = t.expand(latents.shape[0]).to(latents.dtype)
            guided: dict[str, torch.Tensor] = {}
            for name, model in branches:
                with model() as denoiser:
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
                if do_true_cfg:
                    positive, negative = velocities
                    guided[name] = negative + true_cfg_scale * (positive - negative)
                else:
                    guided[name] = velocities[0]
            velocity = (
                next(iter(guided.values()))
                if len(guided) == 1
                else rlg_combine(guided["reference"], guided["rl"], rlg_scale)
            )
            latents = self.scheduler.step(velocity, t, latents, return_dict=False)[0]
            if callback_on_step_end is not None:
                outputs = callback_on_step_end(self, i, t, {"latents": latents})
                latents = (outputs or {}).get("latents", latents)
        self._current_timestep = None

        # 5. Decode
        if output_type == "latent":
            image = latents
        else:
            latents = self._unpack_latents(latents, height, width, self.vae_scale_factor)
            latents = (latents / self.vae.config.scaling_factor) + self.vae.config.shift_factor
            image = self.vae.decode(latents, return_dict=False)[0]
            image = self.image_processor.postprocess(image, output_type=output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return (image,)
        return RLGPipelineOutput(images=image)


_SANA_BINS = {
    128: ASPECT_RATIO_4096_BIN,
    64: ASPECT_RATIO_2048_BIN,
    32: ASPECT_RATIO_1024_BIN,
    16: ASPECT_RATIO_512_BIN,
}
_SANA_INSTRUCTION = inspect.signature(SanaPipeline.__call__).parameters["complex_human_instruction"].default


class RLGSanaPipeline(_RLGMixin, SanaPipeline):
    """RLG (Jin et al. 2025) for SANA linear-attention DiTs (flow matching, Gemma-2 encoder).

    Everything of :class:`~diffusers.SanaPipeline` (resolution binning, the complex human
    instruction prefix, LoRA loading) plus an optional ``rl_transformer`` component.
    """

    _optional_components = [*getattr(SanaPipeline, "_optional_components", []), "rl_transformer"]
    _denoiser_name = "transformer"
    _rl_denoiser_name = "rl_transformer"

    def __init__(
        self,
        tokenizer: GemmaTokenizer | GemmaTokenizerFast,
        text_encoder: Gemma2PreTrainedModel,
        vae: AutoencoderDC,
        transformer: SanaTransformer2DModel,
        scheduler: DPMSolverMultistepScheduler | FlowMatchEulerDiscreteScheduler,
        rl_transformer: SanaTransformer2DModel | None = None,
    ) -> None:
        super().__init__(
            tokenizer=tokenizer,
            text_encoder=text_encoder,
            vae=vae,
            transformer=transformer,
            scheduler=scheduler,
        )
        self.register_modules(rl_transformer=rl_transformer)

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
        callback_on_step_end: Callable[[DiffusionPipeline, int, int, dict], dict] | None = None,
        clean_caption: bool = False,
        use_resolution_binning: bool = True,
        max_sequence_length: int = 300,
        complex_human_instruction: list[str] | None = _SANA_INSTRUCTION,
    ) -> RLGPipelineOutput | tuple:
        """Sample with RLG: per step, CFG in each branch, then ``v_ref + w (v_RL - v_ref)``.

        Args:
            rlg_scale: ``w`` (0: reference model, 1: RL-tuned model, > 1: extrapolation).
            Other arguments as :class:`~diffusers.SanaPipeline`.
        """
        # 1. Check inputs (resolution binning as SanaPipeline); default: the native size (1024 px for SANA 1.6B)
        self._check_rlg(rlg_scale)
        height = height or self.transformer.config.sample_size * self.vae_scale_factor
        width = width or self.transformer.config.sample_size * self.vae_scale_factor
        if use_resolution_binning:
            sample_size = self.transformer.config.sample_size
            if sample_size not in _SANA_BINS:
                raise ValueError(
                    f"resolution binning needs a transformer sample_size in {sorted(_SANA_BINS)}, got {sample_size}; "
                    "pass use_resolution_binning=False"
                )
            orig_height, orig_width = height, width
            height, width = self.image_processor.classify_height_width_bin(
                height, width, ratios=_SANA_BINS[sample_size]
            )
        self.check_inputs(prompt, height, width, None, negative_prompt)
        self._guidance_scale = guidance_scale
        self._attention_kwargs = None
        self._interrupt = False
        batch_size = 1 if isinstance(prompt, str) else len(prompt)
        device = self._execution_device
        do_cfg = guidance_scale > 1.0

        # 2. Encode the prompt under each branch (a LoRA may touch the text encoder too)
        branches = self._branches(rlg_scale)
        embeds: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for name, model in branches:
            with model():
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
            if do_cfg:
                positive, mask = (
                    torch.cat([negative, positive], dim=0),
                    torch.cat([negative_mask, mask], dim=0),
                )
            embeds[name] = (positive, mask)

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
        self._num_timesteps = len(timesteps)
        for i, t in enumerate(timesteps):
            model_input = torch.cat([latents] * 2) if do_cfg else latents
            timestep = t.expand(model_input.shape[0]) * self.transformer.config.timestep_scale
            guided: dict[str, torch.Tensor] = {}
            for name, model in branches:
                prompt_embeds, prompt_mask = embeds[name]
                with model() as denoiser:
                    prediction = denoiser(
                        model_input.to(dtype=transformer_dtype),
                        encoder_hidden_states=prompt_embeds.to(dtype=transformer_dtype),
                        encoder_attention_mask=prompt_mask,
                        timestep=timestep,
                        return_dict=False,
                        attention_kwargs=self.attention_kwargs,
                    )[0]
                prediction = _cfg(prediction.float(), guidance_scale, do_cfg)
                if self.transformer.config.out_channels // 2 == channels:  # learned sigma: keep the mean
                    prediction = prediction.chunk(2, dim=1)[0]
                guided[name] = prediction
            velocity = (
                next(iter(guided.values()))
                if len(guided) == 1
                else rlg_combine(guided["reference"], guided["rl"], rlg_scale)
            )
            latents = self.scheduler.step(velocity, t, latents, **extra_step_kwargs, return_dict=False)[0]
            if callback_on_step_end is not None:
                outputs = callback_on_step_end(self, i, t, {"latents": latents})
                latents = (outputs or {}).get("latents", latents)

        # 5. Decode
        if output_type == "latent":
            image = latents
        else:
            latents = latents.to(self.vae.dtype)
            image = self.vae.decode(latents / self.vae.config.scaling_factor, return_dict=False)[0]
            if use_resolution_binning:
                image = self.image_processor.resize_and_crop_tensor(image, orig_width, orig_height)
            image = self.image_processor.postprocess(image, output_type=output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return (image,)
        return RLGPipelineOutput(images=image)


_FAMILIES: dict[str, type[DiffusionPipeline]] = {
    "StableDiffusionPipeline": RLGStableDiffusionPipeline,
    "RLGStableDiffusionPipeline": RLGStableDiffusionPipeline,
    "StableDiffusion3Pipeline": RLGStableDiffusion3Pipeline,
    "RLGStableDiffusion3Pipeline": RLGStableDiffusion3Pipeline,
    "StableDiffusionXLPipeline": RLGStableDiffusionXLPipeline,
    "RLGStableDiffusionXLPipeline": RLGStableDiffusionXLPipeline,
    "FluxPipeline": RLGFluxPipeline,
    "RLGFluxPipeline": RLGFluxPipeline,
    "SanaPipeline": RLGSanaPipeline,
    "RLGSanaPipeline": RLGSanaPipeline,
}


class RLGPipeline:
    """Reinforcement Learning Guidance (Jin et al. 2025): picks the family's RLG pipeline.

    Like diffusers' ``AutoPipelineForText2Image``: ``RLGPipeline.from_pretrained(path)`` reads
    the folder's pipeline class (SD -> :class:`RLGStableDiffusionPipeline`, SDXL ->
    :class:`RLGStableDiffusionXLPipeline`, SD3 -> :class:`RLGStableDiffusion3Pipeline`, FLUX ->
    :class:`RLGFluxPipeline`, SANA -> :class:`RLGSanaPipeline`); ``RLGPipeline.from_pipe(pipe)`` shares an existing
    pipeline's modules (and its loaded LoRA). Then ``pipe.load_lora_weights(rl_lora)`` (or
    ``rl_unet=`` / ``rl_transformer=``) and ``pipe(prompt, rlg_scale=w, ...)``.
    """

    def __init__(self) -> None:
        raise TypeError("use RLGPipeline.from_pretrained(...) or RLGPipeline.from_pipe(...)")

    @staticmethod
    def family(class_name: str) -> type[DiffusionPipeline]:
        if class_name not in _FAMILIES:
            raise ValueError(f"RLG supports {sorted(set(_FAMILIES))} pipelines, got {class_name}")
        return _FAMILIES[class_name]

    @classmethod
    def from_pretrained(cls, path: str, **kwargs: Any) -> DiffusionPipeline:
        config = DiffusionPipeline.load_config(path)
        for name, value in config.items():  # components saved as absent (SD3 without T5) stay absent
            if isinstance(value, (list, tuple)) and list(value) == [None, None]:
                kwargs.setdefault(name, None)
        return cls.family(config["_class_name"]).from_pretrained(path, **kwargs)

    @classmethod
    def from_pipe(cls, pipe: DiffusionPipeline, **kwargs: Any) -> DiffusionPipeline:
        return cls.family(type(pipe).__name__).from_pipe(pipe, **kwargs)
