"""The ``sd`` family: Stable Diffusion 1.x / 2.x and SDXL UNets with the DDIM step policy.

Each denoising step is the DDIM posterior with stochasticity ``eta`` (DDPO, Black et al. 2023,
Sec. 4.2; DDIM, Song et al. 2021, eq. 12) computed by :func:`genalign.sampling.ddim_step`.
Classifier-free guidance (Ho & Salimans 2022) is applied inside :meth:`SDPolicy.predict`, so a
recomputed log-prob sees exactly the guided output that was sampled from.
"""

from __future__ import annotations

from typing import Any

import torch

from genalign.policies.base import DiffusionPolicy
from genalign.policies.trajectory import RolloutSettings
from genalign.sampling import StepOutput, ddim_step


class SDPolicy(DiffusionPolicy):
    """SD1.x/2.x (``StableDiffusionPipeline``) and SDXL (``StableDiffusionXLPipeline``) policies."""

    family = "sd"
    default_steps = 50
    default_guidance_scale = 5.0

    denoiser_name = "unet"

    @property
    def is_sdxl(self) -> bool:
        return getattr(self.pipeline, "text_encoder_2", None) is not None

    def make_scheduler(self, scheduler: Any) -> Any:
        from diffusers import DDIMScheduler

        # The DDIM step policy needs DDIM's schedule; other schedulers' configs convert losslessly.
        return DDIMScheduler.from_config(scheduler.config)

    def default_size(self) -> tuple[int, int]:
        size = self.pipeline.unet.config.sample_size * self.pipeline.vae_scale_factor
        return size, size

    def uses_cfg(self, guidance_scale: float) -> bool:
        """Classifier-free guidance runs an unconditional branch when the scale exceeds 1."""
        return guidance_scale > 1.0

    def encode_prompts(
        self, prompts: list[str], guidance_scale: float, negative_prompt: str
    ) -> dict[str, torch.Tensor]:
        cfg = self.uses_cfg(guidance_scale)
        # An empty negative prompt is passed as None so each pipeline applies its own default
        # (SDXL's force_zeros_for_empty_prompt zeroes the unconditional embedding).
        negative = [negative_prompt] * len(prompts) if cfg and negative_prompt else None
        if self.is_sdxl:
            pe, npe, pooled, npooled = self.pipeline.encode_prompt(
                prompts,
                device=self.device,
                num_images_per_prompt=1,
                do_classifier_free_guidance=cfg,
                negative_prompt=negative,
            )
            cond = {"prompt_embeds": pe, "pooled_prompt_embeds": pooled}
            if cfg:
                cond.update(negative_prompt_embeds=npe, negative_pooled_prompt_embeds=npooled)
            return cond
        pe, npe = self.pipeline.encode_prompt(prompts, self.device, 1, cfg, negative)
        cond = {"prompt_embeds": pe}
        if cfg:
            cond["negative_prompt_embeds"] = npe
        return cond

    def prepare_latents(
        self, batch_size: int, height: int, width: int, generators: list[torch.Generator]
    ) -> torch.Tensor:
        from diffusers.utils.torch_utils import randn_tensor

        scale = self.pipeline.vae_scale_factor
        shape = (batch_size, self.pipeline.unet.config.in_channels, height // scale, width // scale)
        noise = randn_tensor(shape, generator=generators, device=self.device, dtype=self.model_dtype)
        # The policy's own scheduler sets the initial noise scale (the pipeline's may be another kind).
        return noise * self.scheduler.init_noise_sigma

    def set_timesteps(self, num_inference_steps: int, latents: torch.Tensor) -> torch.Tensor:
        if getattr(self.scheduler, "num_inference_steps", None) != num_inference_steps:
            self.scheduler.set_timesteps(num_inference_steps, device=self.device)
        return self.scheduler.timesteps

    def _added_conditioning(
        self, cond: dict[str, torch.Tensor], settings: RolloutSettings, cfg: bool
    ) -> dict | None:
        if not self.is_sdxl:
            return None
        size = (settings.height, settings.width)
        projection_dim = self.pipeline.text_encoder_2.config.projection_dim
        time_ids = self.pipeline._get_add_time_ids(
            size, (0, 0), size, dtype=cond["prompt_embeds"].dtype, text_encoder_projection_dim=projection_dim
        ).to(self.device)
        pooled = cond["pooled_prompt_embeds"]
        if cfg:
            pooled = torch.cat([cond["negative_pooled_prompt_embeds"], pooled])
        return {"text_embeds": pooled, "time_ids": time_ids.expand(pooled.shape[0], -1)}

    def predict(
        self,
        latents: torch.Tensor,
        step_index: torch.Tensor,
        conditioning: dict[str, torch.Tensor],
        settings: RolloutSettings,
    ) -> torch.Tensor:
        unet = self.pipeline.unet
        cfg = self.uses_cfg(settings.guidance_scale)
        t = self._timestep(step_index)  # (B,)
        embeds = conditioning["prompt_embeds"]
        model_input = latents
        if cfg:  # one batched call on [uncond; cond]
            model_input = torch.cat([latents, latents])
            t = torch.cat([t, t])
            embeds = torch.cat([conditioning["negative_prompt_embeds"], embeds])
        timestep_cond = None
        if unet.config.time_cond_proj_dim is not None:
            w = torch.full((model_input.shape[0],), settings.guidance_scale - 1.0)
            timestep_cond = self.pipeline.get_guidance_scale_embedding(
                w, embedding_dim=unet.config.time_cond_proj_dim
            )
            timestep_cond = timestep_cond.to(self.device, model_input.dtype)
        out = unet(
            model_input.to(self.model_dtype),
            t,
            encoder_hidden_states=embeds.to(self.model_dtype),
            timestep_cond=timestep_cond,
            added_cond_kwargs=self._added_conditioning(conditioning, settings, cfg),
            return_dict=False,
        )[0]
        if cfg:
            uncond, text = out.chunk(2)
            out = uncond + settings.guidance_scale * (text - uncond)
        return out

    def _alpha_bar(self, step_index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """alpha_bar at each sample's grid step, float32, shaped to broadcast against ``like``."""
        t = self.scheduler.timesteps[step_index.to(self.scheduler.timesteps.device)].cpu().long()
        abar = self.scheduler.alphas_cumprod.cpu()[t].to(like.device, torch.float32)
        return abar.reshape(-1, *([1] * (like.ndim - 1)))

    def forward_noise(self, x0, noise, step_index):
        """x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps (DDPM, Ho et al. 2020, eq. 4) at the grid
        step's timestep; the target follows the scheduler's ``prediction_type``."""
        abar = self._alpha_bar(step_index, x0)
        x0, noise = x0.float(), noise.to(x0.device).float()
        x_t = abar.sqrt() * x0 + (1 - abar).sqrt() * noise
        kind = self.scheduler.config.prediction_type
        if kind == "epsilon":
            target = noise
        elif kind == "v_prediction":  # Salimans & Ho 2022, Sec. 4
            target = abar.sqrt() * noise - (1 - abar).sqrt() * x0
        elif kind == "sample":
            target = x0
        else:
            raise ValueError(f"unknown prediction_type {kind!r} of the scheduler")
        return x_t, target

    def predict_x0(self, x_t, model_output, step_index):
        """x0 = (x_t - sqrt(1 - abar) eps) / sqrt(abar) (DDIM, Song et al. 2021, eq. 12's
        "predicted x0"); for v: x0 = sqrt(abar) x_t - sqrt(1 - abar) v."""
        abar = self._alpha_bar(step_index, x_t)
        x_t, out = x_t.float(), model_output.float()
        kind = self.scheduler.config.prediction_type
        if kind == "epsilon":
            return (x_t - (1 - abar).sqrt() * out) / abar.sqrt()
        if kind == "v_prediction":
            return abar.sqrt() * x_t - (1 - abar).sqrt() * out
        if kind == "sample":
            return out
        raise ValueError(f"unknown prediction_type {kind!r} of the scheduler")

    step_kernel = staticmethod(ddim_step)  # the step kernel of this family, called by :meth:`kernel`

    def kernel_options(self, settings: RolloutSettings) -> dict[str, Any]:
        """The options of :attr:`step_kernel` that ``settings`` decide (DDIM's ``eta``)."""
        return {"eta": settings.eta}

    def kernel(self, model_output, step_index, latents, settings, prev_sample, generator) -> StepOutput:
        return self.step_kernel(
            self.scheduler,
            model_output,
            self._timestep(step_index),
            latents,
            prev_sample=prev_sample,
            generator=generator,
            **self.kernel_options(settings),
        )

    def decode(self, latents: torch.Tensor, settings: RolloutSettings) -> torch.Tensor:
        vae = self.pipeline.vae
        latents = latents.to(vae.dtype) / vae.config.scaling_factor
        image = vae.decode(latents, return_dict=False)[0]
        return (image / 2 + 0.5).clamp(0, 1)
