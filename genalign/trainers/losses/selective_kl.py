"""Astrolabe's selective KL in the trainer: the per-sample KL mask and the lagging reference.

Astrolabe (arXiv 2603.17051) as released (``franklinz233/Astrolabe`` @ 35a5347,
``scripts/train_nft_wan.py``, ``use_select_kl``, the code's "GARDO"; configs
``longlive_video_hpsv3_gardo*``). The math and its state are
:mod:`genalign.algorithms.selective_kl`; this module is what the ``astrolabe`` loss
(:class:`~genalign.trainers.losses.astrolabe.AstrolabeLoss`) runs around it, one training step
being the official epoch:

1. **Before the update** (the loss's ``prepare_update`` hook): :func:`reset_reference_at_epoch`
   with the step index; on a reset the current trainable weights are copied into the **lagging
   reference**, a list of tensors swapped into the policy's trainable parameters for the reference
   prediction (as DiffusionNFT's old policy; the official ``old_ref`` adapter, which starts as a
   copy of the trained adapter). Then the main and the other rewards (an ``ensemble``'s members,
   ``RolloutBatch.sample_details``) are gathered over processes, ranked over the global batch and
   :func:`select_kl_samples` gives the mask ``[B_global]``; this process's rows of it go into
   ``batch.trajectory.extras[KL_MASK_KEY]``, which ``Trajectory.select`` carries into every
   minibatch, so each loss call gets ``kl_mask = mask[rows]``.
2. **Per loss call** the masked KL before lambda (``astrolabe_kl_loss``) is recorded.
3. **Before each optimiser step** (``before_optimizer_step``): the mean of the recorded KLs on
   each process, averaged over the processes that made calls (the official ``all_reduce(AVG)`` of
   the per-GPU means), goes to :func:`observe_reference_kl`.
4. **After the step** (``end_step``) the step's state is committed. Until then the committed state
   is the step's start, so the checkpoint a failed step writes (its snapshot) resumes exactly: a
   reset it had made is made again with the same weights.

The committed :class:`SelectiveKLState` and the reference tensors are checkpointed with the loss.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from genalign.algorithms.selective_kl import (
    SelectiveKLState,
    observe_reference_kl,
    reset_reference_at_epoch,
    select_kl_samples,
    selective_kl_reward_names,
)
from genalign.config import ConfigError
from genalign.trainers.losses.forward_process import (
    load_parameter_copy,
    parameter_copy_state,
    swapped_trainable_parameters,
)

if TYPE_CHECKING:
    from genalign.trainers.strategies.base import RolloutBatch

__all__ = ["KL_MASK_KEY", "SelectiveKL"]

KL_MASK_KEY = "selective_kl_mask"  # trajectory.extras key of the per-sample KL mask [B] bool
STATE_PREFIX = "selective_kl."
REFERENCE_PREFIX = "ref."


class SelectiveKL:
    """The selective KL's trainer side (module docstring); ``options``: ``train.astrolabe``."""

    def __init__(self, options: Any) -> None:
        self.constants = options.selective_kl_constants
        self.main: str = options.main_reward
        self.requested_others: list[str] | None = options.other_rewards
        self.others: list[str] = list(options.other_rewards or [])
        self.state = SelectiveKLState.initial(self.constants)  # committed: the last finished step's
        self.step_state: SelectiveKLState | None = None  # this step's, committed by :meth:`end`
        self.reference: list[torch.Tensor] | None = None
        self.kl_values: list[float] = []  # this optimiser step's KL per loss call

    # ---- set-up --------------------------------------------------------------------------------
    def bind(self, reward: Any) -> None:
        """Resolve the ranked rewards against the ensemble's member keys (refusals name the key)."""
        keys = getattr(reward, "keys", None)
        if not isinstance(keys, list):
            raise ConfigError(
                f"train.astrolabe.selective_kl ranks an ensemble's members, but reward {reward.name!r} has no member keys"
            )
        if self.main not in keys:
            raise ConfigError(
                f"train.astrolabe.main_reward {self.main!r} is not one of the ensemble's members {keys}"
            )
        if self.requested_others is None:
            self.others, _ = selective_kl_reward_names(keys, self.main)
        else:
            unknown = [key for key in self.requested_others if key not in keys]
            if unknown:
                raise ConfigError(
                    f"train.astrolabe.other_rewards {unknown} are not among the ensemble's members {keys}"
                )
        if not self.others:
            raise ConfigError(
                f"train.astrolabe.selective_kl needs an ensemble member besides main_reward {self.main!r} to rank against, got {keys}"
            )

    # ---- the lagging reference -----------------------------------------------------------------
    def ensure_reference(self, policy: Any) -> list[torch.Tensor]:
        """The reference tensors; the first are the current (initial) trainable weights."""
        if self.reference is None:
            self.reference = [p.detach().clone() for p in policy.trainable_parameters()]
        return self.reference

    def swapped(self, policy: Any) -> contextlib.AbstractContextManager:
        """Within this context the policy's trainable parameters hold the lagging reference."""
        return swapped_trainable_parameters(policy, self.ensure_reference(policy), "lagging reference")

    @torch.no_grad()
    def _reset(self, policy: Any) -> None:
        for target, source in zip(self.ensure_reference(policy), policy.trainable_parameters(), strict=True):
            target.copy_(source.detach())

    # ---- one training step ---------------------------------------------------------------------
    def prepare(self, trainer: Any, batch: RolloutBatch, step: int) -> dict[str, float]:
        """The reset rule, then the step's mask into ``batch.trajectory.extras``; its metrics."""
        self.ensure_reference(trainer.policy)
        state, reset = reset_reference_at_epoch(self.state, step, self.constants)
        if reset:
            self._reset(trainer.policy)
        scores = {key: _global_scores(trainer, batch, key) for key in [*self.others, self.main]}
        state, mask, info = select_kl_samples(
            state, scores[self.main], [scores[key] for key in self.others], self.constants
        )
        batch.trajectory.extras[KL_MASK_KEY] = mask[batch.global_index.cpu().long()]
        self.step_state, self.kl_values = state, []
        return {
            "selective_kl_fraction": float(state.fraction),  # b
            "selective_kl_selected": float(mask.sum()),
            "selective_kl_selected_fraction": float(mask.double().mean()),
            "selective_kl_selection_threshold": float(info["kl_selection_threshold"]),
            "selective_kl_rank_min": float(info.get("reward_rank_min", 0.0)),
            "selective_kl_rank_mean": float(info.get("reward_rank_mean", 0.0)),
            "selective_kl_rank_max": float(info.get("reward_rank_max", 0.0)),
            "selective_kl_reset": float(reset),
            "selective_kl_reset_threshold": float(state.kl_threshold),
        }

    def observe(self, kl_loss: torch.Tensor) -> None:
        """Record one loss call's masked KL (before lambda)."""
        self.kl_values.append(float(kl_loss))

    def before_optimizer_step(self, trainer: Any) -> None:
        """Flag a reset when this optimiser step's KL, averaged over processes, is above the threshold."""
        if self.step_state is None:
            raise RuntimeError("selective KL: an optimiser step before the step's prepare_update hook")
        values = self.kl_values
        local = torch.tensor([sum(values) / max(len(values), 1), float(bool(values))], dtype=torch.float32)
        gathered = trainer.gather(local.to(trainer.device)).cpu().reshape(-1, 2)  # (processes, 2)
        made_calls = gathered[:, 1] > 0
        self.kl_values = []
        if bool(made_calls.any()):
            kl = float(gathered[made_calls, 0].double().mean())
            self.step_state = observe_reference_kl(self.step_state, kl)

    def end(self) -> dict[str, float]:
        """Commit the step's state; the metrics it ends with."""
        if self.step_state is not None:
            self.state, self.step_state = self.step_state, None
        return {"selective_kl_reset_pending": float(self.state.reset_pending)}

    # ---- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The committed state (plain numbers as tensors) and the reference tensors."""
        state = self.state.state_dict()
        tensors = {
            f"{STATE_PREFIX}fraction": torch.tensor(state["fraction"], dtype=torch.float64),
            f"{STATE_PREFIX}history": torch.tensor(state["history"], dtype=torch.float64),
            f"{STATE_PREFIX}kl_threshold": torch.tensor(state["kl_threshold"], dtype=torch.float64),
            f"{STATE_PREFIX}last_reset_epoch": torch.tensor(state["last_reset_epoch"], dtype=torch.int64),
            f"{STATE_PREFIX}reset_pending": torch.tensor(int(state["reset_pending"]), dtype=torch.int64),
        }
        return tensors | parameter_copy_state(REFERENCE_PREFIX, self.reference)

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        state = {
            key[len(STATE_PREFIX) :]: value for key, value in tensors.items() if key.startswith(STATE_PREFIX)
        }
        if not state:
            raise KeyError(
                "the checkpoint holds no selective KL state (saved without train.astrolabe.selective_kl?)"
            )
        self.state = SelectiveKLState()
        self.state.load_state_dict(
            {
                "fraction": float(state["fraction"]),
                "history": [float(v) for v in state["history"].tolist()],
                "kl_threshold": float(state["kl_threshold"]),
                "last_reset_epoch": int(state["last_reset_epoch"]),
                "reset_pending": bool(int(state["reset_pending"])),
            }
        )
        self.step_state, self.kl_values = None, []
        self.reference = load_parameter_copy(tensors, REFERENCE_PREFIX, self.reference, "reference")


def _global_scores(trainer: Any, batch: RolloutBatch, key: str) -> torch.Tensor:
    """``[B_global]`` fp32 (CPU): reward member ``key``'s scores of every process, in global order."""
    local = batch.sample_details.get(key)
    if local is None:
        raise ValueError(
            f"train.astrolabe.selective_kl: the batch holds no per-sample scores of {key!r} "
            f"(it has {sorted(batch.sample_details)}); roll out with train.strategy 'astrolabe'"
        )
    index = trainer.gather(batch.global_index.to(trainer.device).long()).cpu()
    values = trainer.gather(local.to(trainer.device).float()).cpu()
    scores = torch.full((batch.global_batch_size,), float("nan"))
    scores[index] = values
    return scores
