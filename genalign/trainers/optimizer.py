"""The optimiser and learning-rate schedule of a :class:`~genalign.trainers.trainer.Trainer`.

AdamW over the policy's trainable parameters (one parameter group per trained policy of a
:class:`~genalign.policies.JointPolicy`, each at its own rate) and a ``LambdaLR`` whose factor
after ``n`` optimiser steps is ``train.learning_rate_factor(n)`` (warm-up and schedule:
:mod:`genalign.algorithms.schedules`). Kept apart from the loop so that the trainer module stays
about the loop.
"""

from __future__ import annotations

from typing import Any

import torch

from genalign.policies import JointPolicy

__all__ = ["make_optimizer", "optimizer_groups"]


def make_optimizer(policy: Any, train: Any) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with ``train``'s betas, weight decay and epsilon over :func:`optimizer_groups`, and
    its learning-rate scheduler (``train``: a :class:`~genalign.trainers.train_config.TrainConfig`)."""
    optimizer = torch.optim.AdamW(
        optimizer_groups(policy, train),  # one per policy of a JointPolicy, with its own lr
        lr=train.learning_rate,
        betas=tuple(train.adam_betas),
        weight_decay=train.adam_weight_decay,
        eps=train.adam_epsilon,
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: train.learning_rate_factor(n))


def optimizer_groups(policy: Any, train: Any) -> list[dict[str, Any]]:
    """AdamW's parameter groups: one for a single policy; for a
    :class:`~genalign.policies.JointPolicy` one per policy that has trainable parameters, named
    after it, at ``train.policy_learning_rates[name]`` (default ``train.learning_rate``)."""
    if not isinstance(policy, JointPolicy):
        return [{"params": policy.trainable_parameters()}]
    rates = dict(train.policy_learning_rates)
    unknown = sorted(set(rates) - set(policy.names()))
    if unknown:
        raise ValueError(
            f"train.policy_learning_rates.{unknown[0]}: no policy of that name; the joint policy has {policy.names()}"
        )
    return [
        {"params": parameters, "lr": rates.get(name, train.learning_rate), "name": name}
        for name, parameters in policy.parameter_groups().items()
        if parameters
    ]
