"""Selective KL of Astrolabe's multi-reward runs (arXiv 2603.17051; the released code's "GARDO").

Read from ``franklinz233/Astrolabe`` @ 35a5347, ``scripts/train_nft_wan.py`` (``use_select_kl``,
``RiskCompensator``; configs ``longlive_video_hpsv3_gardo*``, main reward HPSv3). The KL to a
reference is applied only to the samples on which the main reward disagrees most with the others,
and the reference is a lagging copy of the policy that is reset from time to time:

1. **Disagreement.** Every reward is ranked over the global batch (1 = best); for sample i,
   ``d_i = rank_main,i - mean_k rank_k,i`` over the other rewards (at most two: the first two
   reward names that are neither the main one nor the weighted sum ``"avg"``).
2. **Selection fraction b** (``RiskCompensator``): with ``m`` the mean of the non-negative d, b is
   reset to its base 0.1 on the first step; afterwards it is multiplied by 1.1 when ``m`` exceeds
   the maximum of the last 20 steps' m, by 0.9 when it is below their minimum, and clipped to
   [0.02, 0.2]; then ``m`` joins the 20-step history.
3. **Mask.** With the updated b, the KL applies where ``d_i`` is strictly above the
   ``(100 - 100 b)``-th percentile (linear interpolation, numpy's default) of the non-negative d.
4. **Lagging reference.** ``reset_pending`` is raised after any optimiser step whose KL (before
   lambda, averaged over its minibatches) exceeds the threshold (0.15 at first). At the start of
   each epoch the reference adapter is reset to the current weights when a reset is pending
   (epoch > 0) or when more than 15 epochs have passed since the last reset; a reset more than 15
   epochs after the previous one lowers the threshold by 0.01 (floor 0.1), one fewer than 5 epochs
   after it raises it by 0.01, capped at 0.05 as released (see ``SelectiveKLConfig``).

State lives in :class:`SelectiveKLState` (plain numbers, ``state_dict`` / ``load_state_dict``, so a
run resumes exactly); the step functions are pure: they return a new state and never mutate theirs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = [
    "SelectiveKLConfig",
    "SelectiveKLState",
    "reset_reference_at_epoch",
    "kl_selection_threshold",
    "observe_reference_kl",
    "rank_disagreement",
    "reward_ranks",
    "select_kl_samples",
    "selective_kl_reward_names",
    "update_selection_fraction",
]


@dataclass(frozen=True)
class SelectiveKLConfig:
    """The selective KL's constants; the defaults are the released code's.

    ``fraction_*``: b's base, growth rate (x(1 +- rate)), bounds and history length
    (``RiskCompensator(base=0.1)``: alpha 0.1, [0.02, 0.2], 20 steps).
    ``kl_threshold*``: the reset threshold's start, step, floor (after a slow reset) and cap (after
    a quick one). The released code caps the raised threshold at 0.05, below its floor of 0.1 and
    its start of 0.15, so a quick reset *lowers* it to 0.05; that is kept as the default (the
    official run) and ``kl_threshold_cap`` is the knob to change it.
    ``max_epochs_without_reset`` / ``quick_reset_epochs``: 15 and 5.
    """

    fraction_base: float = 0.1
    fraction_rate: float = 0.1
    fraction_min: float = 0.02
    fraction_max: float = 0.2
    history_length: int = 20
    kl_threshold: float = 0.15
    kl_threshold_step: float = 0.01
    kl_threshold_floor: float = 0.1
    kl_threshold_cap: float = 0.05
    max_epochs_without_reset: int = 15
    quick_reset_epochs: int = 5

    def __post_init__(self) -> None:
        if not 0 < self.fraction_min <= self.fraction_base <= self.fraction_max <= 1:
            raise ValueError(
                "need 0 < fraction_min <= fraction_base <= fraction_max <= 1, got "
                f"{self.fraction_min}, {self.fraction_base}, {self.fraction_max}"
            )
        if self.history_length < 1:
            raise ValueError(f"history_length must be positive, got {self.history_length}")


@dataclass
class SelectiveKLState:
    """What the selective KL carries between steps (all plain Python numbers).

    ``fraction``: b; ``history``: the last ``history_length`` means of the non-negative d, oldest
    first; ``kl_threshold``: the reset threshold; ``last_reset_epoch``: the official
    ``prev_epoch``; ``reset_pending``: the official ``reset`` flag.
    """

    fraction: float = 0.1
    history: list[float] = field(default_factory=list)
    kl_threshold: float = 0.15
    last_reset_epoch: int = 0
    reset_pending: bool = False

    @classmethod
    def initial(cls, config: SelectiveKLConfig | None = None) -> SelectiveKLState:
        """The state the official trainer starts from under ``config``."""
        config = config or SelectiveKLConfig()
        return cls(fraction=config.fraction_base, kl_threshold=config.kl_threshold)

    def state_dict(self) -> dict[str, Any]:
        return {
            "fraction": float(self.fraction),
            "history": [float(value) for value in self.history],
            "kl_threshold": float(self.kl_threshold),
            "last_reset_epoch": int(self.last_reset_epoch),
            "reset_pending": bool(self.reset_pending),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = {f.name for f in dataclasses.fields(self)} - set(state)
        if missing:
            raise KeyError(f"selective KL state lacks {sorted(missing)}")
        self.fraction = float(state["fraction"])
        self.history = [float(value) for value in state["history"]]
        self.kl_threshold = float(state["kl_threshold"])
        self.last_reset_epoch = int(state["last_reset_epoch"])
        self.reset_pending = bool(state["reset_pending"])


def selective_kl_reward_names(
    names: Sequence[str], main_reward: str, aggregate: str = "avg", max_others: int = 2
) -> tuple[list[str], str]:
    """``(others, main)``: the rewards the released code ranks. ``others`` are the first
    ``max_others`` names, in order, that are neither ``main_reward`` nor the weighted sum
    ``aggregate`` (``[k for k in keys if k not in ['avg', main]][:2]``)."""
    if main_reward not in names:
        raise KeyError(f"main reward {main_reward!r} is not among {list(names)}")
    others = [name for name in names if name not in (aggregate, main_reward)][:max_others]
    return others, main_reward


def reward_ranks(rewards: torch.Tensor) -> torch.Tensor:
    """Rank of each reward over the batch, ``[B]`` long, 1 = the highest.

    The released code sorts descending and writes ``arange(1, B + 1)`` at the sorted positions, so
    tied rewards get distinct consecutive ranks. Its ``torch.sort`` is not stable, leaving ties'
    order unspecified; here the sort is stable, so among equal rewards the earlier sample ranks
    better.
    """
    if rewards.ndim != 1:
        raise ValueError(f"rewards must have shape [B], got {list(rewards.shape)}")
    order = torch.sort(rewards.detach().cpu(), descending=True, stable=True).indices  # [B]
    ranks = torch.empty(rewards.shape[0], dtype=torch.long)
    ranks[order] = torch.arange(1, rewards.shape[0] + 1)
    return ranks


def rank_disagreement(main_rewards: torch.Tensor, other_rewards: Sequence[torch.Tensor]) -> torch.Tensor:
    """``d = rank(main) - mean_k rank(other_k)`` ``[B]`` (float64, CPU); positive where the main
    reward ranks a sample worse than the others do on average (the released code's sign)."""
    if not other_rewards:
        raise ValueError("rank_disagreement needs at least one other reward")
    main = reward_ranks(main_rewards).double()
    others = torch.stack([reward_ranks(rewards).double() for rewards in other_rewards])  # [K, B]
    if others.shape[1] != main.shape[0]:
        raise ValueError(f"other rewards have {others.shape[1]} samples, the main one {main.shape[0]}")
    return main - others.sum(0) / others.shape[0]


def _non_negative(disagreement: torch.Tensor) -> np.ndarray:
    values = disagreement.detach().double().cpu().numpy()
    return values[values >= 0]


def kl_selection_threshold(disagreement: torch.Tensor, fraction: float) -> float:
    """The ``(100 - 100 fraction)``-th percentile of the non-negative ``disagreement`` (numpy's
    linear interpolation, as released); the mean rank difference is 0, so some d is >= 0."""
    non_negative = _non_negative(disagreement)
    if non_negative.size == 0:
        raise ValueError("no non-negative disagreement to take a percentile of")
    return float(np.percentile(non_negative, 100 - fraction * 100))


def update_selection_fraction(
    state: SelectiveKLState, mean_disagreement: float, config: SelectiveKLConfig | None = None
) -> SelectiveKLState:
    """One ``RiskCompensator.update``: a new state with b adapted to ``mean_disagreement`` (the
    mean non-negative d of this batch) and that mean appended to the bounded history."""
    config = config or SelectiveKLConfig()
    history = list(state.history)
    if not history:
        fraction = config.fraction_base
    elif mean_disagreement > max(history):
        fraction = state.fraction * (1 + config.fraction_rate)
    elif mean_disagreement < min(history):
        fraction = state.fraction * (1 - config.fraction_rate)
    else:
        fraction = state.fraction
    fraction = min(max(fraction, config.fraction_min), config.fraction_max)
    history = (history + [float(mean_disagreement)])[-config.history_length :]
    return dataclasses.replace(state, fraction=float(fraction), history=history)


def select_kl_samples(
    state: SelectiveKLState,
    main_rewards: torch.Tensor,
    other_rewards: Sequence[torch.Tensor],
    config: SelectiveKLConfig | None = None,
) -> tuple[SelectiveKLState, torch.Tensor, dict[str, float]]:
    """The per-epoch selection: ``(new state, mask [B] bool, info)``.

    Ranks the rewards (:func:`rank_disagreement`), adapts b on the mean non-negative d
    (:func:`update_selection_fraction`), then selects ``d > threshold`` with the *updated* b
    (:func:`kl_selection_threshold`), in the released order. With no other reward the released
    code applies the KL to every sample and leaves b alone; so does this.
    """
    batch_size = main_rewards.shape[0]
    if not other_rewards:
        info = {"kl_selection_threshold": 0.0, "kl_selected_fraction": 1.0}
        return state, torch.ones(batch_size, dtype=torch.bool), info
    disagreement = rank_disagreement(main_rewards, other_rewards)  # [B]
    state = update_selection_fraction(state, float(np.mean(_non_negative(disagreement))), config)
    threshold = kl_selection_threshold(disagreement, state.fraction)
    mask = disagreement > threshold  # [B]
    info = {
        "kl_selection_threshold": threshold,
        "kl_selection_fraction": state.fraction,
        "kl_selected_fraction": float(mask.double().mean()),
        "reward_rank_min": float(disagreement.min()),
        "reward_rank_mean": float(disagreement.mean()),
        "reward_rank_max": float(disagreement.max()),
    }
    return state, mask, info


def observe_reference_kl(state: SelectiveKLState, kl_loss: float) -> SelectiveKLState:
    """After an optimiser step: raise ``reset_pending`` when its KL (the masked x0 KL before lambda,
    averaged over the step's minibatches and processes) exceeds the threshold; never lower it."""
    if float(kl_loss) > state.kl_threshold:
        return dataclasses.replace(state, reset_pending=True)
    return state


def reset_reference_at_epoch(
    state: SelectiveKLState, epoch: int, config: SelectiveKLConfig | None = None
) -> tuple[SelectiveKLState, bool]:
    """At the start of ``epoch`` (0-based): ``(new state, reset)``; on ``reset`` the caller copies
    the current weights into the reference adapter.

    Released rule (run only when the KL weight is positive): reset when ``reset_pending`` and
    ``epoch > 0``, or when ``epoch - last_reset_epoch > 15``; then clear the flag, lower the
    threshold by 0.01 (to at least 0.1) if more than 15 epochs passed, set it to
    ``min(threshold + 0.01, cap)`` if fewer than 5 did, and record the epoch.
    """
    config = config or SelectiveKLConfig()
    gap = epoch - state.last_reset_epoch
    if not ((epoch != 0 and state.reset_pending) or gap > config.max_epochs_without_reset):
        return state, False
    threshold = state.kl_threshold
    if gap > config.max_epochs_without_reset:
        threshold = max(threshold - config.kl_threshold_step, config.kl_threshold_floor)
    if gap < config.quick_reset_epochs:
        threshold = min(threshold + config.kl_threshold_step, config.kl_threshold_cap)
    new_state = dataclasses.replace(
        state, kl_threshold=float(threshold), last_reset_epoch=int(epoch), reset_pending=False
    )
    return new_state, True
