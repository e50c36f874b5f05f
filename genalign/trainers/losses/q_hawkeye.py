"""Q-Hawkeye's loss for IQA judges: token-level GRPO with a k3 KL, minus a perception term.

Xie et al. 2026, "Q-Hawkeye" (arXiv 2601.22920; official ``grpo_trainer.py`` @ 905262f). Per
completion token ``t`` of sequence ``i``, with ``rho = exp(log pi_theta - log pi_old)``::

    l_it = -A_i rho_it + beta k3(pi_ref || pi_theta)_it                        (main, as trl 0.18)
    L    = aggregate(l) - gamma(step) * mean_g mean_{i in g, t} k3_perc_it     (perception)
    k3_perc = exp(d) - d - 1,  d = log pi_theta(o_t | degraded image) - log pi_theta(o_t | image)

where the degraded re-scoring is a constant (no gradient) and ``k3_perc`` is clamped to
[-10, 10] (:func:`genalign.algorithms.q_hawkeye.perception_term`), token-averaged within each
image's group ``g`` of completions and then averaged over images, as the official trainer averages
per device batch of one image (the strategy stores each row's ``G / N_g`` in
``trajectory.extras[ROW_SCALE_KEY]``, so minibatches that mix groups weight them alike; without it,
the token mean of the minibatch). Subtracting it pushes the
output distributions given the original and the degraded image apart (the paper's "perception
loss"), so the judge must look at the image. ``gamma`` is ``train.q_hawkeye.perception_gamma``
(1e-4) cosine-annealed to 0 over ``perception_anneal_steps`` training steps
(:func:`~genalign.algorithms.q_hawkeye.cosine_annealed`; the official run anneals to 0 at epoch 5
of 15). The released script's "double entropy" terms (``-eta1 sum log p_orig - eta2 sum log p_deg``)
are off: its config never defines the flags that enable them (docs/fidelity.md).

The main term is the ``token_ppo`` loss (:class:`~genalign.trainers.losses.token_ppo.TokenPPOLoss`,
its aggregation and ``train.kl_coef``: 0.04 as trl 0.18's default ``beta``), without ratio clipping
as the official loss (``exp(logp - sg(logp)) * A``), or clipped to ``train.token_ppo``'s range with
``train.q_hawkeye.ratio_clip``. The current log-probs are computed once for both terms. The
degraded copy comes from the ``q_hawkeye`` strategy: ``trajectory.extras["degraded:<input>"]``,
the processor's inputs (``pixel_values``) of each sample's degraded image.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from genalign.algorithms import NO_CLIP, cosine_annealed, perception_term
from genalign.trainers.losses.base import LOSSES
from genalign.trainers.losses.token_ppo import TokenPPOLoss

__all__ = ["COPY_ROWS_KEY", "DEGRADED_PREFIX", "ROW_SCALE_KEY", "QHawkeyeLoss", "degraded_trajectory"]

DEGRADED_PREFIX = "degraded:"  # extras key prefix of the degraded image's model inputs
# extras key of a bool [B]: the rows that are degraded copies (``train.q_hawkeye.copy_weight``),
# shown the degraded image already, so their perception term is 0 and their re-scoring is skipped
COPY_ROWS_KEY = "q_hawkeye:copy_rows"
# extras key of a float [B]: G_g / N_g of each row's group (perception_row_scale over the whole batch)
ROW_SCALE_KEY = "q_hawkeye:perception_row_scale"


def degraded_trajectory(trajectory: Any) -> Any:
    """``trajectory`` with its model inputs replaced by the degraded image's (same tokens), or a
    ValueError when the strategy kept no degraded copy."""
    degraded = {
        key[len(DEGRADED_PREFIX) :]: value
        for key, value in trajectory.extras.items()
        if key.startswith(DEGRADED_PREFIX)
    }
    if not degraded:
        raise ValueError(
            "the q_hawkeye loss's perception term needs each sample's degraded image "
            "(trajectory.extras['degraded:pixel_values']): roll out with train.strategy 'q_hawkeye', "
            "or set train.q_hawkeye.perception_gamma to 0"
        )
    return dataclasses.replace(trajectory, model_inputs={**trajectory.model_inputs, **degraded})


@LOSSES.register("q_hawkeye")
class QHawkeyeLoss(TokenPPOLoss):
    """``token_ppo`` (no ratio clipping by default) minus Q-Hawkeye's annealed perception term
    (module docstring). Options: ``train.q_hawkeye`` (``perception_gamma``,
    ``perception_anneal_steps``, ``perception_clamp``, ``ratio_clip``), ``train.token_ppo``
    (aggregation; the clip range when ``ratio_clip``) and ``train.kl_coef``. Metrics: the
    ``token_ppo`` ones, ``perception_k3`` (the mean the term weights) and ``perception_gamma``."""

    def __init__(self, config: Any) -> None:  # the recipe's TrainConfig
        super().__init__(config)
        self.step = 0

    def begin_step(self, step: int) -> None:
        self.step = int(step)

    def gamma(self, step: int) -> float:
        """The perception weight at training step ``step``."""
        options = self.config.q_hawkeye
        horizon = options.perception_anneal_steps
        horizon = self.config.num_steps if horizon is None else horizon
        return cosine_annealed(options.perception_gamma, float(step), float(horizon))

    def __call__(self, policy, trajectory, step_index, advantages):
        options = self.config.q_hawkeye
        log_probs = policy.log_prob(trajectory)  # (B, L) under the current weights
        clip = None if options.ratio_clip else NO_CLIP
        loss, metrics = self.token_loss(policy, trajectory, log_probs, advantages, clip_range=clip)
        gamma = self.gamma(self.step)
        metrics["perception_gamma"] = torch.tensor(gamma)
        if gamma > 0:  # 0 once annealed: the degraded forward is skipped
            with torch.no_grad():
                degraded = self.degraded_log_probs(policy, trajectory, log_probs)  # (B, L), a constant
            term, k3 = perception_term(
                log_probs,
                degraded,
                trajectory.completion_mask.to(log_probs.device),
                gamma,
                options.perception_clamp,
                trajectory.extras.get(ROW_SCALE_KEY),
            )
            loss = loss + term
            metrics["perception_k3"] = k3
        return loss, metrics

    @staticmethod
    def degraded_log_probs(policy, trajectory, log_probs: torch.Tensor) -> torch.Tensor:
        """Each row's completion re-scored with its degraded image. A copy row (``COPY_ROWS_KEY``)
        is shown its degraded image already, so it keeps its own log-probs (d = 0, k3 = 0, as the
        re-scoring would give) and only the other rows are run again."""
        copies = trajectory.extras.get(COPY_ROWS_KEY)
        if copies is None or not bool(copies.any()):
            return policy.log_prob(degraded_trajectory(trajectory))
        degraded = log_probs.detach().clone()
        originals = (~copies.bool()).nonzero().flatten().tolist()
        if originals:
            rows = torch.tensor(originals, device=degraded.device)
            degraded[rows] = policy.log_prob(degraded_trajectory(trajectory.select(originals))).to(degraded)
        return degraded
