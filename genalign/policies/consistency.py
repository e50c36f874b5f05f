"""The ``consistency`` family: latent consistency models (LCM) and one-step turbo UNets.

The step policy is RLCM's (Oertell et al. 2024, Sec. 4): the consistency function's clean
estimate f_theta(x_tau, tau) is re-noised to the next timestep with fresh Gaussian noise,
pi(x_next | x_tau) = N(sqrt(alpha_bar_next) f_theta(x_tau, tau), (1 - alpha_bar_next) I), and the
last step returns f_theta deterministically. The kernel is :func:`genalign.sampling.consistency_step`
on the pipeline's ``LCMScheduler`` (a turbo model's scheduler config converts to one).

LCMs embed the guidance scale (``w = guidance_scale - 1``, Luo et al. 2023) instead of running an
unconditional branch; a UNet without ``time_cond_proj_dim`` (sd-turbo) uses ordinary CFG when
``guidance_scale > 1`` and none otherwise.
"""

from __future__ import annotations

from typing import Any

from genalign.policies.sd import SDPolicy
from genalign.sampling import StepOutput, consistency_step


class ConsistencyPolicy(SDPolicy):
    family = "consistency"
    default_steps = 4
    default_guidance_scale = 8.5

    def make_scheduler(self, scheduler: Any) -> Any:
        from diffusers import LCMScheduler

        return LCMScheduler.from_config(scheduler.config)

    def uses_cfg(self, guidance_scale: float) -> bool:
        return self.pipeline.unet.config.time_cond_proj_dim is None and guidance_scale > 1.0

    def kernel(self, model_output, step_index, latents, settings, prev_sample, generator) -> StepOutput:
        t = self.scheduler.timesteps[step_index.to(self.scheduler.timesteps.device)].to(self.device)
        return consistency_step(
            self.scheduler, model_output, t, latents, prev_sample=prev_sample, generator=generator
        )
