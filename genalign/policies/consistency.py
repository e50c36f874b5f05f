"""The ``consistency`` family: latent consistency models (LCM) and one-step turbo UNets.

The step policy is RLCM's (Oertell et al. 2024, Sec. 4): the consistency function's clean
estimate f_theta(x_tau, tau) is re-noised to the next timestep with fresh Gaussian noise,
pi(x_next | x_tau) = N(sqrt(alpha_bar_next) f_theta(x_tau, tau), (1 - alpha_bar_next) I), and the
last step returns f_theta deterministically. The kernel is :func:`genalign.sampling.consistency_step`
on the pipeline's ``LCMScheduler`` (a turbo model's scheduler config converts to one).

Two rollout settings reproduce RLCM's released code where it differs from diffusers:
``lcm_schedule="rlcm"`` takes its timesteps (:func:`genalign.sampling.rlcm_timesteps`; for 8 steps
999 ... 519, 399, 279, 159 where diffusers' ``LCMScheduler`` gives 499, 379, 259, 139), and
``lcm_final_noise=True`` re-noises the last step at its own timestep and scores it, so PPO trains
that step too; the image is then decoded from the last clean estimate, as RLCM does.

LCMs embed the guidance scale (``w = guidance_scale - 1``, Luo et al. 2023) instead of running an
unconditional branch; a UNet without ``time_cond_proj_dim`` (sd-turbo) uses ordinary CFG when
``guidance_scale > 1`` and none otherwise.
"""

from __future__ import annotations

from typing import Any

import torch

from genalign.policies.sd import SDPolicy
from genalign.policies.trajectory import RolloutSettings
from genalign.sampling import StepOutput, consistency_step, rlcm_timesteps

LCM_SCHEDULES = ("diffusers", "rlcm")


class ConsistencyPolicy(SDPolicy):
    family = "consistency"
    default_steps = 4
    default_guidance_scale = 8.5
    _schedule = "diffusers"  # the schedule the scheduler's timesteps were last set for

    def make_scheduler(self, scheduler: Any) -> Any:
        from diffusers import LCMScheduler

        return LCMScheduler.from_config(scheduler.config)

    def uses_cfg(self, guidance_scale: float) -> bool:
        return self.pipeline.unet.config.time_cond_proj_dim is None and guidance_scale > 1.0

    def set_schedule(self, settings: RolloutSettings, latents: torch.Tensor) -> torch.Tensor:
        """diffusers' LCM timesteps, or RLCM's (``settings.lcm_schedule``)."""
        if settings.lcm_schedule not in LCM_SCHEDULES:
            raise ValueError(f"lcm_schedule must be one of {LCM_SCHEDULES}, got {settings.lcm_schedule!r}")
        if settings.lcm_schedule == "diffusers":
            # set afresh when another schedule of the same length is active
            if self._schedule != "diffusers":
                self.scheduler.num_inference_steps = None
            self._schedule = "diffusers"
            return self.set_timesteps(settings.num_inference_steps, latents)
        config = self.scheduler.config
        wanted = rlcm_timesteps(
            settings.num_inference_steps, config.num_train_timesteps, config.original_inference_steps
        )
        if self._schedule != "rlcm" or self.scheduler.timesteps.tolist() != wanted:
            self.scheduler.set_timesteps(timesteps=wanted, device=self.device)
            self._schedule = "rlcm"
        return self.scheduler.timesteps

    def clean_sample(self, last_step: StepOutput, settings: RolloutSettings) -> torch.Tensor:
        """With RLCM's re-noised last step, the image is its clean estimate f(x_t, t)."""
        if settings.lcm_final_noise:
            return last_step.pred_original_sample.to(last_step.prev_sample.dtype)
        return last_step.prev_sample

    step_kernel = staticmethod(consistency_step)

    def kernel_options(self, settings: RolloutSettings) -> dict[str, Any]:
        """RLCM's re-noised last step (``settings.lcm_final_noise``)."""
        return {"final_noise": settings.lcm_final_noise}
