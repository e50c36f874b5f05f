"""ReFL: reward feedback learning, the gradient of a differentiable reward through one denoising step.

Xu et al. 2023, "ImageReward: Learning and Evaluating Human Preferences for Text-to-Image
Generation", the ReFL section and its Algorithm 1: denoise without gradients from x_T to a step
t drawn from a window of the sampling chain, predict the clean sample from x_t in one step,

    x0_hat = (x_t - sqrt(1 - abar_t) eps_theta(x_t, t, c)) / sqrt(abar_t)        (eps models)
    x0_hat = x_t - sigma_t v_theta(x_t, t, c)                                   (rectified flow)

decode it and ascend the reward: L = -scale * r(decode(x0_hat), c), gradients flowing through
the reward model, the VAE decoder and the one denoiser call (``policy.predict_x0``). The official
code (ImageReward's ``ReFL.py``) uses the hinge ``L = grad_scale * ReLU(2 - r)`` with
``grad_scale = 1e-3`` and the conditional prediction (no classifier-free guidance); that is
``train.refl.objective = "relu"``, ``margin = 2``, ``scale = 1e-3``, ``guided = false``
(:func:`refl_objective`). The hinge stops pushing a sample once its reward passes the margin. The paper
picks t among the last steps, where x0_hat is already a recognisable image; the window here is
``train.refl.min_step .. max_step`` in grid-step indices (0 = the noisiest step), so an earlier
window can reach composition (colour, layout) that the last steps no longer change.

The rollout supplies x_t, so the chain before t costs one ordinary no-gradient rollout, shared
with the reward logging and the verifier monitors. ``train.kl_coef`` adds
``kl_coef * ||f_theta - f_ref||^2`` at the same x_t, a stand-in for the paper's pre-training loss
that keeps the model near the reference. The reward must be differentiable
(``reward.differentiable``: CLIP-family scores, PickScore, HPS, aesthetic, ensembles of them);
advantages are not used. Samples whose score is NaN are left out of the loss and counted
(``refl_nan_count``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from genalign.algorithms.refl import refl_objective
from genalign.trainers.losses.base import LOSSES, PolicyLoss
from genalign.trainers.losses.forward_process import conditional_settings, with_reference_kl

if TYPE_CHECKING:
    from genalign.trainers.trainer import Trainer

__all__ = ["ReFLLoss"]


@LOSSES.register("refl")
class ReFLLoss(PolicyLoss):
    """Reward feedback through a one-step x0 prediction (module docstring; config ``train.refl``)."""

    forward_process = True  # trains on any rollout step, ODE rollouts included

    def __init__(self, config: Any) -> None:
        self.config = config
        self.refl = config.refl
        self.reward: Any = None

    def bind(self, trainer: Trainer) -> None:
        """Take the trainer's reward; it must pass gradients to the images."""
        if not getattr(trainer.reward, "differentiable", False):
            raise ValueError(
                f"the refl loss needs a differentiable reward, but {type(trainer.reward).__name__} "
                "is not (use clip, pickscore, hps, aesthetic or an ensemble of differentiable members)"
            )
        self.reward = trainer.reward

    def train_steps(self, num_steps: int) -> torch.Tensor:
        """The grid steps ReFL may train on: ``min_step .. max_step`` (None: the last step)."""
        last = num_steps - 1 if self.refl.max_step is None else min(self.refl.max_step, num_steps - 1)
        if self.refl.min_step > last:
            raise ValueError(
                f"train.refl.min_step {self.refl.min_step} lies after the last trainable step {last} "
                f"of a {num_steps}-step rollout"
            )
        return torch.arange(self.refl.min_step, last + 1)

    def __call__(self, policy, trajectory, step_index, advantages):
        if self.reward is None:
            raise RuntimeError("the refl loss has no reward: the trainer binds it (ReFLLoss.bind)")
        config, refl = self.config, self.refl
        step_index = step_index.to(torch.long).cpu()
        settings = trajectory.settings
        policy.set_schedule(settings, trajectory.latents[:, 0])
        rows = torch.arange(trajectory.batch_size)
        x_t = trajectory.latents[rows, step_index].to(policy.device)
        predict_settings = settings if refl.guided else conditional_settings(policy, settings)
        output = policy.predict(x_t, step_index, trajectory.conditioning, predict_settings)
        x0 = policy.predict_x0(x_t, output, step_index)
        images = policy.decode(x0.to(policy.model_dtype), settings).float()
        scores = self.reward(images, list(trajectory.prompts)).scores.float()
        # a sample the reward cannot score (NaN) must not reach the weights: it is left out
        finite = torch.isfinite(scores.detach())
        kept = scores[finite]
        if kept.numel():
            loss = refl_objective(kept, refl.objective, refl.scale, refl.margin)
        else:
            loss = 0.0 * output.float().sum()
        metrics = {
            "policy_loss": loss.detach(),
            "refl_reward": kept.detach().mean() if kept.numel() else torch.tensor(float("nan")),
            "refl_nan_count": (~finite).sum().float(),
        }
        return with_reference_kl(
            loss,
            metrics,
            config.kl_coef,
            policy,
            output,
            x_t,
            step_index,
            trajectory.conditioning,
            predict_settings,
        )
