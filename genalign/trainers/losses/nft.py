"""DiffusionNFT: online diffusion RL on the forward process (Zheng et al. 2025, arXiv:2509.16117).

The loss kernel and the old-policy schedule are pure functions in :mod:`genalign.algorithms.nft`;
this module is the trainer's loss: the old policy, the seeded noise and the policy's forward process.

Instead of likelihoods of reverse steps, DiffusionNFT trains with the flow-matching objective on
the clean samples of the rollouts. With x_0 a sample, eps ~ N(0, I) and t in (0, 1]:

    x_t = (1 - t) x_0 + t eps,      v* = eps - x_0                              (flow matching)

the positive and the implicit negative policy are (Sec. 3.2, eq. 7)

    v+(x_t) = (1 - beta) v_old(x_t) + beta v_theta(x_t)
    v-(x_t) = (1 + beta) v_old(x_t) - beta v_theta(x_t)

and the loss weighs the two by the optimality probability r in [0, 1] of each sample (eq. 8):

    L = r ||v+ - v*||^2 + (1 - r) ||v- - v*||^2,      r = clip(A, -c, c) / (2c) + 1/2

with A the group-normalised advantage. v_old is the sampling ("old") policy, kept as an EMA of
the trained weights, theta_old <- eta_i theta_old + (1 - eta_i) theta after each training step
(Sec. 4, "soft update"), with eta_i = min(rate * max(i - flat, 0), max) and i the number of
optimiser steps so far (the paper's schedule: rate 0.001, max 0.5, flat 0; the official code's
``return_decay`` with ``decay_type=1``). Rollouts are drawn from the old policy, as in the paper
(data collection with v_old) and in the official code (``set_adapter("old")`` while sampling).

Adaptive weighting (Sec. 4 and the official code): each squared error is taken in x_0-prediction
space and divided by its own stop-gradient mean absolute error,

    x0+ = x_t - t v+,   l+ = mean((x0+ - x_0)^2) / sg(mean|x0+ - x_0|)

and the same for v-. Since x0+ - x_0 = -t (v+ - v*), this is the velocity loss of eq. 8 weighted
per sample by t / mean|v+ - v*|, which makes the loss scale-free across t. As in the official
code, the loss is multiplied by c / beta (a constant gradient scale), and an optional
``train.kl_coef * ||v_theta - v_ref||^2`` keeps the policy near the reference model.

Guidance. DiffusionNFT is CFG-free (Sec. 4): v_theta, v_old and v_ref are the conditional
velocities, and the official trainer samples with guidance 1. Rollouts drawn with classifier-free
guidance > 1 therefore still train the conditional branch here (``train.nft.guided = False``, the
default); ``guided = True`` regresses the guided output the rollouts were sampled with instead.
A guidance scale the denoiser takes as an input (FLUX.1-dev, LCM's w-embedding) is kept either way.

Other parameterisations (our extension; the paper trains rectified flows). Eq. 7 mixes the
denoiser's outputs linearly, and every parameterisation's one-step x0 prediction is affine in the
output (flow: x0 = x_t - t v; DDPM eps: x0 = (x_t - sqrt(1 - abar) eps) / sqrt(abar); v:
x0 = sqrt(abar) x_t - sqrt(1 - abar) v), so x0(f+) = beta x0(f_theta) + (1 - beta) x0(f_old) and
likewise for f-. The loss is therefore written once, on the policy's own forward process
(``policy.forward_noise``: x_t and the regression target) and x0 prediction
(``policy.predict_x0``): the adaptive form on x0 predictions, the plain form on the outputs
against the regression target. For a flow policy this is exactly the equations above; for a
DDPM-family (``sd``) policy it is DiffusionNFT's loss in that model's own parameterisation, with
x_t drawn at the grid step's timestep.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from genalign.algorithms.astrolabe import soft_update_
from genalign.algorithms.nft import nft_loss_in_x0, nft_old_policy_decay
from genalign.trainers.config import NFT_FAMILIES
from genalign.trainers.losses.base import LOSSES, PolicyLoss
from genalign.trainers.losses.forward_process import (
    conditional_settings,
    load_parameter_copy,
    parameter_copy_state,
    seeded_noise,
    swapped_trainable_parameters,
    with_reference_kl,
)

if TYPE_CHECKING:
    from genalign.policies import DiffusionPolicy, Trajectory
    from genalign.trainers.trainer import Trainer

logger = logging.getLogger(__name__)

__all__ = ["NFTLoss"]

# added to a group id to key its shared noise (train.group_noise) apart from any sample seed's
GROUP_NOISE_KEY = 1 << 40


@LOSSES.register("nft")
class NFTLoss(PolicyLoss):
    """DiffusionNFT as a trainer loss (see the module docstring; config ``train.nft``).

    Hooks (:class:`~genalign.trainers.losses.base.PolicyLoss`): ``forward_process = True`` (train on
    any step of any rollout, ODE included: step indices only choose the noise level t = sigma_i of
    the sampler's grid, as the official code does), :meth:`begin_step` (the training step that keys
    the noise), :meth:`rollout_policy` (rollouts from the old policy) and :meth:`end_step` (the old
    policy's soft update). The old weights are checkpointed through :meth:`state_dict`.

    The noise eps of a sample is drawn from a generator seeded by (training step, sample seed, step
    index), so N processes draw what one process would; the training step is ``current_step``,
    which only :meth:`begin_step` sets (the trainer calls it first in every step).

    A loss built on this old policy (Astrolabe's) sets :attr:`options` to its own config section
    (read for ``rollout_policy``) and overrides :meth:`old_policy_decay`; the hooks stay these.
    """

    forward_process = True
    row_mean = True  # nft_loss_in_x0 is per sample; the noise is keyed per row (train.fuse_timesteps)
    group_noise = True  # train.group_noise: the noise is keyed by the row's prompt group instead
    decay_metric = "nft_old_decay"

    def __init__(self, config: Any) -> None:
        self.config = config
        self.options = config.nft
        self.old_parameters: list[torch.Tensor] | None = None
        self.current_step = 0

    # ---- the old policy ------------------------------------------------------------------------
    def _ensure_old(self, policy: DiffusionPolicy) -> list[torch.Tensor]:
        if self.old_parameters is None:
            self.old_parameters = [p.detach().clone() for p in policy.trainable_parameters()]
        return self.old_parameters

    @contextlib.contextmanager
    def old_policy(self, policy: DiffusionPolicy) -> Iterator[DiffusionPolicy]:
        """Within this context the policy's trainable parameters hold the old (EMA) weights."""
        with swapped_trainable_parameters(policy, self._ensure_old(policy), "old policy"):
            yield policy

    def begin_step(self, step: int) -> None:
        """Key this step's noise by the training step ``step``."""
        self.current_step = step

    def rollout_policy(self, trainer: Trainer, step: int) -> contextlib.AbstractContextManager:
        """The context rollouts run in: the old policy (``rollout_policy = "old"``) or the current one."""
        self._ensure_old(trainer.policy)  # the first old policy is the initial weights
        if self.options.rollout_policy == "old":
            return self.old_policy(trainer.policy)
        return contextlib.nullcontext()

    def old_policy_decay(self, optimizer_steps: int) -> float:
        """eta after ``optimizer_steps`` optimiser steps (:func:`~genalign.algorithms.nft.nft_old_policy_decay`)."""
        nft = self.options
        return nft_old_policy_decay(optimizer_steps, nft.ema_rate, nft.ema_max, nft.ema_flat)

    @torch.no_grad()
    def end_step(self, trainer: Trainer, step: int) -> dict[str, float]:
        """theta_old <- eta theta_old + (1 - eta) theta, eta from the optimiser step count."""
        eta = self.old_policy_decay(trainer.optimizer_steps)
        soft_update_(self._ensure_old(trainer.policy), trainer.policy.trainable_parameters(), eta)
        return {self.decay_metric: eta}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return parameter_copy_state("old.", self.old_parameters)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        # a subclass adds keys of its own; only "old." ones are the old policy
        self.old_parameters = load_parameter_copy(state, "old.", self.old_parameters, "old-policy")

    # ---- the loss ------------------------------------------------------------------------------
    def noise(self, trajectory: Trajectory, step_index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """eps ``[B, ...]``, one generator per sample keyed by (step, seed, step index); under
        ``train.group_noise`` by (step, prompt group, step index), so a group's samples share it."""
        keys = trajectory.seeds
        if self.config.group_noise:
            keys = trajectory.group_ids.cpu() + GROUP_NOISE_KEY
        noise = seeded_noise(keys, step_index, like.shape[1:], step=self.current_step)
        return noise.to(like.device, like.dtype)

    def __call__(self, policy, trajectory, step_index, advantages):
        if policy.family not in NFT_FAMILIES:
            raise ValueError(
                f"the nft loss trains a flow or DDPM-family policy (family {' or '.join(map(repr, NFT_FAMILIES))}), "
                f"got family {policy.family!r}"
            )
        config, nft = self.config, self.options
        step_index = step_index.to(torch.long).cpu()
        settings = trajectory.settings
        policy.set_schedule(settings, trajectory.latents[:, 0])
        # CFG-free as the paper: the conditional branch, unless nft.guided asks for the guided output
        predict_settings = settings if nft.guided else conditional_settings(policy, settings)
        x0 = trajectory.latents[:, -1].float()  # (B, ...) clean samples
        eps = self.noise(trajectory, step_index, x0)
        # flow: x_t = (1 - t) x0 + t eps at t = sigma_i and v* = eps - x0; sd: DDPM noising
        x_t, target = policy.forward_noise(x0, eps, step_index)
        with torch.no_grad(), self.old_policy(policy):
            out_old = policy.predict(x_t, step_index, trajectory.conditioning, predict_settings).float()
        out_theta = policy.predict(x_t, step_index, trajectory.conditioning, predict_settings).float()
        per_sample, info = nft_loss_in_x0(
            out_theta,
            out_old,
            target,
            policy.predict_x0(x_t, out_theta, step_index),
            policy.predict_x0(x_t, out_old, step_index),
            x0,
            advantages.to(x0.device).float(),
            beta=nft.beta,
            advantage_clip=nft.advantage_clip,
            adaptive_weighting=nft.adaptive_weighting,
            weight_min=nft.weight_min,
        )
        loss = per_sample.mean()
        metrics = {"policy_loss": loss.detach(), **info}
        return with_reference_kl(
            loss,
            metrics,
            config.kl_coef,
            policy,
            out_theta,
            x_t,
            step_index,
            trajectory.conditioning,
            predict_settings,
        )
