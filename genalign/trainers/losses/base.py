"""The loss contract: how sampled trajectories and their advantages become gradients.

A loss gets a minibatch of trajectories, one step index per sample and the advantages, and
returns a scalar (the mean over the minibatch) plus metrics. Everything else a loss may do in the
training lifecycle is a hook declared on :class:`PolicyLoss` with a no-op default, so the trainer
calls each one unconditionally and a loss overrides only those it needs:

========================  ==========================================================================
hook                      called / used
========================  ==========================================================================
``bind(trainer)``         once, when the trainer is built (ReFL takes the reward)
``begin_step(step)``      first thing in every training step (DiffusionNFT keys its noise by it)
``rollout_policy(...)``   the context the step's rollouts run in (DiffusionNFT: the old policy)
``forward_process``       True: noises the final samples itself, so every step index of any
                          rollout (ODE included) is trainable, not only the stochastic ones
``train_steps(T)``        the step indices the loss may train on (ReFL's window); None: all
``prepare_update(...)``   once the step's batch is scored and has advantages, before its update
                          (not on a skipped step); may attach per-sample tensors to
                          ``batch.trajectory.extras``, which minibatches carry row by row
                          (Astrolabe's selective-KL mask); returns metrics
``before_optimizer_step`` when an optimiser step's minibatches are done, before it is applied
                          (or skipped for a non-finite gradient; Astrolabe's reset watch)
``end_step(trainer, s)``  after the step's last optimiser step; returns metrics (NFT's soft update)
``state_dict()``          tensors checkpointed with the run, restored by ``load_state_dict``
========================  ==========================================================================
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from genalign.registry import Registry

if TYPE_CHECKING:
    from genalign.policies import DiffusionPolicy, Trajectory

LOSSES: Registry[type[PolicyLoss]] = Registry("loss")

__all__ = ["LOSSES", "FunctionLoss", "PolicyLoss", "as_policy_loss"]

LossOutput = tuple[torch.Tensor, dict[str, torch.Tensor]]


class PolicyLoss(abc.ABC):
    """Base class of the losses; the hooks of the module docstring, each a no-op by default.

    ``trainer`` in a hook's arguments is the :class:`~genalign.trainers.trainer.Trainer` (a hook
    reads ``reward``, ``policy`` or ``optimizer_steps`` from it).
    """

    forward_process: bool = False
    # the loss is the mean over its rows of terms that each depend on their own row only, so the
    # trainer may run a minibatch's trained steps as one call on the rows repeated
    # (``train.fuse_timesteps``); a loss that couples rows or steps keeps False
    row_mean: bool = False
    # the loss keys its forward noise by prompt group when ``train.group_noise`` is set (nft)
    group_noise: bool = False

    @abc.abstractmethod
    def __call__(
        self,
        policy: DiffusionPolicy,
        trajectory: Trajectory,
        step_index: torch.Tensor,
        advantages: torch.Tensor,
    ) -> LossOutput:
        """The mean loss over the minibatch ``trajectory`` (B samples) at ``step_index`` ``[B]``
        with ``advantages`` ``[B]``, and scalar metrics."""

    def bind(self, trainer: Any) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Called once by the trainer's constructor."""

    def begin_step(self, step: int) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Called at the start of training step ``step``, before its rollouts."""

    def rollout_policy(self, trainer: Any, step: int) -> contextlib.AbstractContextManager:
        """The context the rollouts of step ``step`` run in (default: the current policy)."""
        return contextlib.nullcontext()

    def train_steps(self, num_steps: int) -> torch.Tensor | None:
        """The step indices of a ``num_steps``-step trajectory this loss may train on; None: all."""
        return None

    def prepare_update(self, trainer: Any, batch: Any) -> dict[str, float]:
        """Called with the step's scored :class:`~genalign.trainers.strategies.base.RolloutBatch`
        before its update (not on a skipped step); returns metrics."""
        return {}

    def before_optimizer_step(self, trainer: Any) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Called when the minibatches of an optimiser step are done, before it is applied."""

    def end_step(self, trainer: Any, step: int) -> dict[str, float]:
        """Called after the last optimiser step of training step ``step``; returns metrics."""
        return {}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors to checkpoint with the run (none by default)."""
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:  # noqa: B027 - optional hook
        """Restore what :meth:`state_dict` returned (nothing by default)."""


class FunctionLoss(PolicyLoss):
    """A plain callable ``(policy, trajectory, step_index, advantages) -> (loss, metrics)`` used as
    a loss without hooks (a test's recording wrapper, a one-off experiment)."""

    def __init__(self, function: Callable[..., LossOutput]) -> None:
        self.function = function

    def __call__(self, policy, trajectory, step_index, advantages):
        return self.function(policy, trajectory, step_index, advantages)


def as_policy_loss(loss: PolicyLoss | Callable[..., LossOutput]) -> PolicyLoss:
    """``loss`` itself when it is a :class:`PolicyLoss`, else wrapped in :class:`FunctionLoss`."""
    return loss if isinstance(loss, PolicyLoss) else FunctionLoss(loss)
