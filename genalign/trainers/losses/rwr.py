"""Reward-weighted regression (RWR): reward-weighted denoising fine-tuning on the policy's own samples.

The baseline DDPO is compared against (Black et al. 2023, "Training Diffusion Models with
Reinforcement Learning", its RWR baselines, after Lee et al. 2023 and Peters & Schaal 2007):
sample x_0 ~ p_theta(x_0 | c), score it, and minimise the ordinary denoising loss weighted by a
function of the reward,

    L(theta) = E_{c, x_0 ~ p_theta, t, eps} [ w(x_0, c) * || f_theta(x_t, t, c) - f*(x_0, eps, t) ||^2 ]

with x_t the forward-noised sample and f* the regression target of the model's parameterisation
(eps, v, or the flow velocity eps - x_0). DDPO's two weightings:

    w_RWR    = exp(beta * r) / Z                                  (exponentiated reward)
    w_sparse = 1[r >= C]                                           (keep the samples above a threshold)

Here r is the trainer's advantage of the sample: its reward standardised over its prompt group
(``train.advantage``/``advantage_std``), so one ``beta`` and one threshold carry across prompts of
different difficulty, and exp(beta * A) needs no batch-wide Z (Adam is invariant to a constant
scale; the default clips A at ``train.advantage_clip``). ``threshold = 0`` keeps the samples that
beat their group's mean, a per-prompt version of the paper's percentile threshold.

Unlike the policy-gradient losses, RWR needs neither log-probabilities nor stochastic sampling
steps: it trains on any step of any rollout (``forward_process = True``), the noise level of a
step index being the one the sampler's grid gives that step. The conditional branch is trained
(no classifier-free guidance), as in pre-training; ``train.kl_coef`` adds
``kl_coef * ||f_theta - f_ref||^2`` to stay near the reference model.
"""

from __future__ import annotations

from typing import Any

import torch

from genalign.algorithms.rwr import rwr_weights
from genalign.trainers.losses.base import LOSSES, PolicyLoss
from genalign.trainers.losses.forward_process import conditional_settings, seeded_noise, with_reference_kl

__all__ = ["RWRLoss"]


@LOSSES.register("rwr")
class RWRLoss(PolicyLoss):
    """Reward-weighted denoising loss (see the module docstring; config ``train.rwr``)."""

    forward_process = True

    def __init__(self, config: Any) -> None:
        self.config = config
        self.rwr = config.rwr

    def __call__(self, policy, trajectory, step_index, advantages):
        config, rwr = self.config, self.rwr
        step_index = step_index.to(torch.long).cpu()
        settings = trajectory.settings
        policy.set_schedule(settings, trajectory.latents[:, 0])
        x0 = trajectory.latents[:, -1].float()
        eps = seeded_noise(trajectory.seeds, step_index, x0.shape[1:]).to(x0.device)
        x_t, target = policy.forward_noise(x0, eps, step_index)
        plain = settings if rwr.guided else conditional_settings(policy, settings)
        prediction = policy.predict(x_t, step_index, trajectory.conditioning, plain).float()
        dims = tuple(range(1, x0.ndim))
        error = ((prediction - target) ** 2).mean(dims)  # (B,)
        weights = rwr_weights(advantages.to(error.device).float(), rwr.weighting, rwr.beta, rwr.threshold)
        loss = (weights * error).mean()
        metrics = {
            "policy_loss": loss.detach(),
            "rwr_denoise_loss": error.detach().mean(),
            "rwr_weight_mean": weights.detach().mean(),
            "rwr_kept": (weights > 0).float().mean(),
        }
        return with_reference_kl(
            loss, metrics, config.kl_coef, policy, prediction, x_t, step_index, trajectory.conditioning, plain
        )
