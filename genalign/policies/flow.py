"""The ``flow`` family: rectified-flow transformers (SD3/SD3.5, FLUX, SANA) with Flow-GRPO's SDE.

The deterministic Euler ODE of flow matching is turned into a stochastic step policy with the
same marginals (Flow-GRPO, Liu et al. 2025, eq. 9; the coefficients-preserving variant of
Wang & Yu 2025 with ``mode="cps"``; ``mode="ode"`` is the plain Euler step). The kernel is
:func:`genalign.sampling.flow_sde_step`.

One class per architecture differs only in prompt encoding, latent layout, the transformer's call
and decoding; :meth:`FlowPolicy.from_pretrained` picks it from the loaded pipeline's class.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from genalign.policies.base import DiffusionPolicy
from genalign.policies.trajectory import RolloutSettings
from genalign.sampling import StepOutput, flow_sde_step


def _calculate_shift(seq_len: int, config: Any, default_max_shift: float) -> float:
    """Resolution-dependent timestep shift ``mu`` (SD3/FLUX), linear in the image token count."""
    base_len = config.get("base_image_seq_len", 256)
    max_len = config.get("max_image_seq_len", 4096)
    base_shift = config.get("base_shift", 0.5)
    max_shift = config.get("max_shift", default_max_shift)
    slope = (max_shift - base_shift) / (max_len - base_len)
    return seq_len * slope + base_shift - slope * base_len


def _conditioning(
    second_name: str,
    positive: tuple[torch.Tensor, torch.Tensor],
    negative: tuple[torch.Tensor, torch.Tensor] | None,
) -> dict[str, torch.Tensor]:
    """``prompt_embeds`` and the family's second prompt tensor (``second_name``: pooled embeds or
    an attention mask), plus their ``negative_*`` pair when CFG runs (``negative`` given)."""
    cond = {"prompt_embeds": positive[0], second_name: positive[1]}
    if negative is not None:
        cond.update({"negative_prompt_embeds": negative[0], f"negative_{second_name}": negative[1]})
    return cond


def _cfg_batch(
    latents: torch.Tensor, t: torch.Tensor, conditioning: dict[str, torch.Tensor], second_name: str, cfg: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(latents, timesteps, prompt_embeds, second tensor)`` for one transformer call: as given,
    or under CFG one batch ``[uncond; cond]`` of twice the size (:func:`_conditioning`'s keys)."""
    embeds, second = conditioning["prompt_embeds"], conditioning[second_name]
    if cfg:
        latents, t = torch.cat([latents, latents]), torch.cat([t, t])
        embeds = torch.cat([conditioning["negative_prompt_embeds"], embeds])
        second = torch.cat([conditioning[f"negative_{second_name}"], second])
    return latents, t, embeds, second


class FlowPolicy(DiffusionPolicy):
    """Base of the flow-matching architectures; use :meth:`from_pretrained` to get the right one."""

    family = "flow"
    default_steps = 10
    default_guidance_scale = 4.5

    denoiser_name = "transformer"

    @classmethod
    def for_pipeline(cls, pipeline: Any) -> type[FlowPolicy]:
        for klass in type(pipeline).__mro__:
            if klass.__name__ in FLOW_ARCHITECTURES:
                return FLOW_ARCHITECTURES[klass.__name__]
        known = ", ".join(sorted(FLOW_ARCHITECTURES))
        raise ValueError(
            f"the flow family does not support {type(pipeline).__name__}; supported pipelines: {known}"
        )

    def make_scheduler(self, scheduler: Any) -> Any:
        """The flow-Euler scheduler of ``scheduler``'s noise grid. A multistep solver in flow mode
        (SANA's diffusers checkpoints ship ``DPMSolverMultistepScheduler`` with ``use_flow_sigmas``
        and ``flow_shift`` 3) keeps its shift as ``shift``; ``from_config`` would drop the key it does
        not know and sample, train and time-condition on the unshifted grid."""
        from diffusers import FlowMatchEulerDiscreteScheduler

        config = scheduler.config
        if config.get("use_flow_sigmas") and "flow_shift" in config:
            return FlowMatchEulerDiscreteScheduler(
                num_train_timesteps=int(config.get("num_train_timesteps", 1000)),
                shift=float(config["flow_shift"]),
            )
        return FlowMatchEulerDiscreteScheduler.from_config(config)

    def default_size(self) -> tuple[int, int]:
        size = self.pipeline.transformer.config.sample_size * self.pipeline.vae_scale_factor
        return size, size

    def latents_dtype(self) -> torch.dtype:
        """The dtype the pipeline's ``prepare_latents`` draws the initial noise in."""
        return self.model_dtype

    def prepare_latents(self, batch_size, height, width, generators):
        channels = self.pipeline.transformer.config.in_channels
        return self.pipeline.prepare_latents(
            batch_size, channels, height, width, self.latents_dtype(), self.device, generators
        )

    def kernel(self, model_output, step_index, latents, settings, prev_sample, generator) -> StepOutput:
        return flow_sde_step(
            self.scheduler,
            model_output,
            step_index,
            latents,
            noise_level=settings.noise_level,
            mode=settings.mode,
            prev_sample=prev_sample,
            generator=generator,
        )

    def _sigma(self, step_index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """sigma at each sample's grid step, float32, shaped to broadcast against ``like``."""
        sigma = self.scheduler.sigmas.cpu()[step_index.cpu().long()].to(like.device, torch.float32)
        return sigma.reshape(-1, *([1] * (like.ndim - 1)))

    def forward_noise(self, x0, noise, step_index):
        """Rectified flow: x_t = (1 - sigma) x0 + sigma eps at the grid step's sigma; target
        v* = eps - x0 (Liu et al. 2023; Esser et al. 2024, eq. 2 and Sec. 3.1)."""
        sigma = self._sigma(step_index, x0)
        x0, noise = x0.float(), noise.to(x0.device).float()
        return (1 - sigma) * x0 + sigma * noise, noise - x0

    def predict_x0(self, x_t, model_output, step_index):
        """x0 = x_t - sigma v (one Euler step to sigma = 0)."""
        sigma = self._sigma(step_index, x_t)
        return x_t.float() - sigma * model_output.float()

    @staticmethod
    def _guided(out: torch.Tensor, settings: RolloutSettings) -> torch.Tensor:
        uncond, text = out.chunk(2)
        return uncond + settings.guidance_scale * (text - uncond)


class SD3Policy(FlowPolicy):
    """Stable Diffusion 3 / 3.5 (``StableDiffusion3Pipeline``, ``SD3Transformer2DModel``)."""

    def encode_prompts(self, prompts, guidance_scale, negative_prompt):
        cfg = guidance_scale > 1.0
        pe, npe, pooled, npooled = self.pipeline.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            device=self.device,
            do_classifier_free_guidance=cfg,
            negative_prompt=[negative_prompt] * len(prompts) if cfg else None,
        )
        return _conditioning("pooled_prompt_embeds", (pe, pooled), (npe, npooled) if cfg else None)

    def set_timesteps(self, num_inference_steps, latents):
        kwargs = {}
        if self.scheduler.config.get("use_dynamic_shifting", None):
            patch = self.pipeline.transformer.config.patch_size
            seq_len = (latents.shape[-2] // patch) * (latents.shape[-1] // patch)
            kwargs["mu"] = _calculate_shift(seq_len, self.scheduler.config, 1.16)
        self.scheduler.set_timesteps(num_inference_steps, device=self.device, **kwargs)
        return self.scheduler.timesteps

    def predict(self, latents, step_index, conditioning, settings):
        transformer = self.pipeline.transformer
        cfg = settings.guidance_scale > 1.0
        t = self._timestep(step_index)
        x, t, embeds, pooled = _cfg_batch(latents, t, conditioning, "pooled_prompt_embeds", cfg)
        out = transformer(
            hidden_states=x.to(self.model_dtype),
            timestep=t,
            encoder_hidden_states=embeds.to(self.model_dtype),
            pooled_projections=pooled.to(self.model_dtype),
            return_dict=False,
        )[0]
        return self._guided(out, settings) if cfg else out

    def decode(self, latents, settings):
        vae = self.pipeline.vae
        latents = latents.to(vae.dtype) / vae.config.scaling_factor + vae.config.shift_factor
        return (vae.decode(latents, return_dict=False)[0] / 2 + 0.5).clamp(0, 1)


class FluxPolicy(FlowPolicy):
    """FLUX.1 (``FluxPipeline``): packed 2x2 latent tokens, guidance embedding when the model has one
    (FLUX.1-dev), otherwise true classifier-free guidance with a negative prompt."""

    default_guidance_scale = 3.5

    def default_size(self) -> tuple[int, int]:
        size = self.pipeline.default_sample_size * self.pipeline.vae_scale_factor
        return size, size

    def size_multiple(self) -> int:
        return self.pipeline.vae_scale_factor * 2  # latents are packed in 2x2 tokens

    @property
    def guidance_embedded(self) -> bool:
        return bool(self.pipeline.transformer.config.guidance_embeds)

    def _uses_cfg(self, guidance_scale: float) -> bool:
        return not self.guidance_embedded and guidance_scale > 1.0

    def encode_prompts(self, prompts, guidance_scale, negative_prompt):
        pe, pooled, _ = self.pipeline.encode_prompt(prompt=prompts, prompt_2=None, device=self.device)
        negative = None
        if self._uses_cfg(guidance_scale):
            negative = self.pipeline.encode_prompt(
                prompt=[negative_prompt] * len(prompts), prompt_2=None, device=self.device
            )[:2]
        return _conditioning("pooled_prompt_embeds", (pe, pooled), negative)

    def prepare_latents(self, batch_size, height, width, generators):
        channels = self.pipeline.transformer.config.in_channels // 4
        dtype = self.model_dtype
        latents, _ = self.pipeline.prepare_latents(
            batch_size, channels, height, width, dtype, self.device, generators
        )
        return latents  # (B, seq, C * 4)

    def set_timesteps(self, num_inference_steps, latents):
        sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)
        kwargs: dict[str, Any] = {"sigmas": sigmas}
        if self.scheduler.config.get("use_flow_sigmas", False):
            kwargs = {}
        if self.scheduler.config.get("use_dynamic_shifting", False):
            kwargs["mu"] = _calculate_shift(latents.shape[1], self.scheduler.config, 1.15)
        self.scheduler.set_timesteps(num_inference_steps, device=self.device, **kwargs)
        return self.scheduler.timesteps

    def _ids(self, settings: RolloutSettings, conditioning: dict) -> tuple[torch.Tensor, torch.Tensor]:
        scale = self.pipeline.vae_scale_factor * 2
        h, w = int(settings.height) // scale, int(settings.width) // scale
        image_ids = self.pipeline._prepare_latent_image_ids(1, h, w, self.device, self.model_dtype)
        text_ids = torch.zeros(conditioning["prompt_embeds"].shape[1], 3, device=self.device)
        return image_ids, text_ids.to(self.model_dtype)

    def predict(self, latents, step_index, conditioning, settings):
        transformer = self.pipeline.transformer
        t = self._timestep(step_index) / 1000
        image_ids, text_ids = self._ids(settings, conditioning)
        guidance = None
        if self.guidance_embedded:
            guidance = torch.full((latents.shape[0],), settings.guidance_scale, device=self.device)

        def call(embeds: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
            return transformer(
                hidden_states=latents.to(self.model_dtype),
                timestep=t.to(self.model_dtype),
                guidance=guidance,
                pooled_projections=pooled.to(self.model_dtype),
                encoder_hidden_states=embeds.to(self.model_dtype),
                txt_ids=text_ids,
                img_ids=image_ids,
                return_dict=False,
            )[0]

        out = call(conditioning["prompt_embeds"], conditioning["pooled_prompt_embeds"])
        if self._uses_cfg(settings.guidance_scale):
            negative = call(
                conditioning["negative_prompt_embeds"], conditioning["negative_pooled_prompt_embeds"]
            )
            out = negative + settings.guidance_scale * (out - negative)
        return out

    def decode(self, latents, settings):
        vae = self.pipeline.vae
        latents = self.pipeline._unpack_latents(
            latents, settings.height, settings.width, self.pipeline.vae_scale_factor
        )
        latents = latents.to(vae.dtype) / vae.config.scaling_factor + vae.config.shift_factor
        return (vae.decode(latents, return_dict=False)[0] / 2 + 0.5).clamp(0, 1)


class SanaPolicy(FlowPolicy):
    """SANA (``SanaPipeline``: linear-attention DiT, deep-compression autoencoder, Gemma2 encoder)."""

    def _call_default(self, name: str) -> Any:
        return inspect.signature(type(self.pipeline).__call__).parameters[name].default

    def encode_prompts(self, prompts, guidance_scale, negative_prompt):
        cfg = guidance_scale > 1.0
        pe, mask, npe, nmask = self.pipeline.encode_prompt(
            prompts,
            cfg,
            negative_prompt=negative_prompt,
            device=self.device,
            max_sequence_length=self._call_default("max_sequence_length"),
            complex_human_instruction=self._call_default("complex_human_instruction"),
        )
        return _conditioning("prompt_attention_mask", (pe, mask), (npe, nmask) if cfg else None)

    def latents_dtype(self) -> torch.dtype:
        return torch.float32  # as SanaPipeline: fp32 latents, cast for each transformer call

    def set_timesteps(self, num_inference_steps, latents):
        self.scheduler.set_timesteps(num_inference_steps, device=self.device)
        return self.scheduler.timesteps

    def predict(self, latents, step_index, conditioning, settings):
        transformer = self.pipeline.transformer
        cfg = settings.guidance_scale > 1.0
        t = self._timestep(step_index) * transformer.config.timestep_scale
        x, t, embeds, mask = _cfg_batch(latents, t, conditioning, "prompt_attention_mask", cfg)
        out = transformer(
            x.to(self.model_dtype),
            encoder_hidden_states=embeds.to(self.model_dtype),
            encoder_attention_mask=mask,
            timestep=t,
            return_dict=False,
        )[0].float()
        if cfg:
            out = self._guided(out, settings)
        if transformer.config.out_channels // 2 == latents.shape[1]:  # learned sigma: keep the mean
            out = out.chunk(2, dim=1)[0]
        return out

    def decode(self, latents, settings):
        vae = self.pipeline.vae
        image = vae.decode(latents.to(vae.dtype) / vae.config.scaling_factor, return_dict=False)[0]
        return (image / 2 + 0.5).clamp(0, 1)


FLOW_ARCHITECTURES: dict[str, type[FlowPolicy]] = {
    "StableDiffusion3Pipeline": SD3Policy,
    "FluxPipeline": FluxPolicy,
    "SanaPipeline": SanaPolicy,
}
