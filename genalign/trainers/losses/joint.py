"""One loss per policy of a joint run, summed, all driven by the same advantage per sample."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from genalign.trainers.losses.base import PolicyLoss

__all__ = ["JointLoss", "PartView"]


class PartView:
    """The trainer as one part's loss sees it: ``policy`` is the part's own policy
    (``trainer.policy[name]``); every other attribute is the trainer's."""

    def __init__(self, trainer: Any, name: str) -> None:
        self._trainer = trainer
        self._name = name

    @property
    def policy(self) -> Any:
        return self._trainer.policy[self._name]

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._trainer, attribute)


class JointLoss(PolicyLoss):
    """The losses of a :class:`~genalign.policies.JointPolicy`'s policies, summed.

    PromptRL (arXiv 2602.01382; UniRL's joint trainer) updates the rewriter with its token loss
    and the generator with Flow-GRPO's PPO loss from one advantage per final image; here every
    part's loss gets the same ``advantages`` ``[B]``, and each part's metrics are logged as
    ``<policy>_<metric>``.

    The trainer calls a loss once per scheduled step index of the ``primary`` part (the
    generator's denoising steps) and scales each call by ``1 / K``; a part whose trajectory is
    one step (a language policy's completion) is re-scored on every call, so its gradient adds up
    to exactly one full-weight update per minibatch. Hooks: ``forward_process``, ``train_steps``
    and ``rollout_policy`` are the primary loss's; ``bind``, ``begin_step``, ``end_step`` and
    the checkpointed state go to every part (state keys prefixed ``<policy>.``). A part's hooks see
    the trainer through :class:`PartView`, whose ``policy`` is that part's policy, so a loss that
    keeps state over its policy's weights (DiffusionNFT's old policy) works unchanged in a joint run.

    Args:
        losses: policy name -> its loss (every policy of the joint policy).
        primary: the policy whose steps the trainer schedules (a key of ``losses``).
    """

    def __init__(self, losses: dict[str, PolicyLoss], primary: str) -> None:
        if primary not in losses:
            raise ValueError(f"primary {primary!r} is not one of the losses' policies {list(losses)}")
        self.losses = dict(losses)
        self.primary = primary
        self.forward_process = losses[primary].forward_process

    def __call__(self, policy, trajectory, step_index, advantages):
        total: torch.Tensor | float = 0.0
        metrics: dict[str, torch.Tensor] = {}
        for name, loss in self.losses.items():
            value, info = loss(policy[name], trajectory.parts[name], step_index, advantages)
            total = total + value
            metrics.update({f"{name}_{key}": metric for key, metric in info.items()})
        return total, metrics

    def bind(self, trainer: Any) -> None:
        for name, loss in self.losses.items():
            loss.bind(PartView(trainer, name))

    def begin_step(self, step: int) -> None:
        for loss in self.losses.values():
            loss.begin_step(step)

    def rollout_policy(self, trainer: Any, step: int) -> contextlib.AbstractContextManager:
        return self.losses[self.primary].rollout_policy(PartView(trainer, self.primary), step)

    def train_steps(self, num_steps: int) -> torch.Tensor | None:
        return self.losses[self.primary].train_steps(num_steps)

    def end_step(self, trainer: Any, step: int) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for name, loss in self.losses.items():
            metrics.update(loss.end_step(PartView(trainer, name), step))
        return metrics

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {f"{name}.{k}": v for name, loss in self.losses.items() for k, v in loss.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, loss in self.losses.items():
            prefix = f"{name}."
            loss.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
