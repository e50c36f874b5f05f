"""Advantages from rewards: group-relative normalisation and the per-prompt statistics tracker.

Two ways of turning a batch of scalar rewards into advantages are in use for generator RL:

* **Group-relative** (GRPO, Shao et al. 2024 "DeepSeekMath", sec. 4.1.2; Flow-GRPO, Liu et al.
  2025): every prompt is sampled ``G`` times in the same batch and each reward is normalised by
  the mean and standard deviation of its own group,
  ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)``.
  Flow-GRPO's released code offers a global variant that divides by the standard deviation of
  the whole batch instead, which keeps the advantage scale comparable between easy and hard
  prompts; Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", sec. 3.1) drops the
  division altogether. :func:`group_advantages` implements all three.
* **Per-prompt history** (DDPO, Black et al. 2023, sec. 4.3 / app. B): rewards are normalised by
  running statistics of past rewards for the same prompt, kept in a bounded buffer; while a prompt
  has few entries the batch statistics stand in. :class:`PerPromptStatTracker` implements it.

Standard deviations are population standard deviations (``ddof=0``), as in DDPO and Flow-GRPO
(numpy's default); trl's GRPO uses the unbiased estimate instead.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

logger = logging.getLogger(__name__)

StdMode = Literal["group", "global", "none"]

__all__ = [
    "PerPromptStatTracker",
    "clip_advantages",
    "clustered_stderr",
    "group_advantages",
    "group_reward_statistics",
]


def _group_index(groups: torch.Tensor | Sequence[Any] | int, batch_size: int) -> torch.Tensor:
    """Map ``groups`` to a dense group index ``[B]`` in ``0..num_groups-1``."""
    if isinstance(groups, bool):
        raise TypeError("groups must be a group size (int) or one group id per sample, not a bool")
    if isinstance(groups, int):
        group_size = groups
        if group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size}")
        if batch_size % group_size != 0:
            raise ValueError(
                f"group_size {group_size} does not divide the batch size {batch_size} "
                f"({batch_size} % {group_size} = {batch_size % group_size})"
            )
        # Contiguous groups, as trl's GRPO lays them out: samples [0, G) share a prompt, then [G, 2G) ...
        return torch.arange(batch_size) // group_size
    if isinstance(groups, torch.Tensor):
        if groups.ndim != 1 or groups.shape[0] != batch_size:
            raise ValueError(f"group_ids must have shape [{batch_size}], got {list(groups.shape)}")
        return torch.unique(groups.cpu(), return_inverse=True)[1]
    ids = list(groups)
    if len(ids) != batch_size:
        raise ValueError(f"got {len(ids)} group ids for {batch_size} rewards")
    index: dict[Any, int] = {}
    return torch.tensor([index.setdefault(group_id, len(index)) for group_id in ids], dtype=torch.long)


def group_advantages(
    rewards: torch.Tensor,
    groups: torch.Tensor | Sequence[Any] | int,
    std: StdMode = "group",
    eps: float = 1e-4,
    baseline: torch.Tensor | None = None,
) -> torch.Tensor:
    """Group-relative advantages (GRPO / Flow-GRPO).

    ``A_i = (r_i - mean_g) / (s + eps)`` where ``mean_g`` is the mean reward of sample ``i``'s
    group and ``s`` is, by ``std``:

    * ``"group"``: the (population) std of that group — GRPO (Shao et al. 2024, sec. 4.1.2);
    * ``"global"``: the std of the whole batch — Flow-GRPO's ``global_std`` option;
    * ``"none"``: no division, ``A_i = r_i - mean_g`` — Dr. GRPO (Liu et al. 2025).

    Args:
        rewards: float ``[B]``.
        groups: either ``group_size`` (int; groups are contiguous blocks ``[0, G)``, ``[G, 2G)``,
            ...) or one group id per sample (an integer tensor ``[B]`` or a sequence of hashables
            such as the prompts themselves).
        std: which standard deviation divides the centred rewards.
        eps: added to the standard deviation (Flow-GRPO and trl use ``1e-4``).
        baseline: float ``[B]``, subtracted instead of the group mean: ``A_i = (r_i - b_i) / (s +
            eps)`` with ``s`` as above (the spread of the rewards themselves). ReMax (Li et al.
            2023, arXiv 2310.10505, Alg. 1) takes ``b_i`` = the reward of the greedy answer to
            sample ``i``'s prompt, so only samples that beat the policy's mode are reinforced.
            Where ``s`` is 0 (a group, or with ``"global"`` the batch, whose rewards all tie) the
            advantages are 0, as without a baseline: ``(r_i - b_i) / eps`` would scale a tie's
            gap to its baseline by ``1 / eps``.

    Returns:
        float ``[B]`` advantages in ``rewards``' dtype (at least float32) and device.

    Raises:
        ValueError: ``group_size`` does not divide ``B``, or ``std="group"`` and some group has
            fewer than 2 members (its std would be 0 and every advantage 0).
    """
    if rewards.ndim != 1:
        raise ValueError(f"rewards must have shape [B], got {list(rewards.shape)}")
    if std not in ("group", "global", "none"):
        raise ValueError(f"std must be 'group', 'global' or 'none', got {std!r}")
    batch_size = rewards.shape[0]
    index = _group_index(groups, batch_size).to(rewards.device)  # [B]
    num_groups = int(index.max().item()) + 1 if batch_size else 0
    counts = torch.bincount(index, minlength=num_groups)  # [num_groups]
    if std == "group" and batch_size and int(counts.min()) < 2:
        small = int(torch.argmin(counts))
        raise ValueError(
            f"group {small} has {int(counts[small])} member(s); std='group' needs at least 2 samples "
            f"per group (batch size {batch_size}, {num_groups} groups)"
        )

    dtype = torch.promote_types(rewards.dtype, torch.float32)
    values = rewards.to(dtype)  # [B]
    # Compute in float64 so a group of near-identical rewards does not lose its spread.
    values64 = values.double()
    group_mean = torch.zeros(num_groups, dtype=torch.float64, device=rewards.device)
    group_mean = group_mean.index_add_(0, index, values64) / counts  # [num_groups]
    centred = values64 - group_mean[index]  # [B]
    if baseline is not None:
        if baseline.shape != rewards.shape:
            raise ValueError(f"baseline must have shape {list(rewards.shape)}, got {list(baseline.shape)}")
        advantages = values64 - baseline.to(device=rewards.device, dtype=torch.float64)  # [B]
    else:
        advantages = centred
    if std == "none":
        return advantages.to(dtype)
    if std == "global":
        scale = values64.std(unbiased=False).expand(batch_size)  # [B]
    else:
        group_var = torch.zeros(num_groups, dtype=torch.float64, device=rewards.device)
        group_var = group_var.index_add_(0, index, centred**2) / counts  # [num_groups]
        scale = group_var.sqrt()[index]  # [B]
    if baseline is not None:  # a tied group has no spread to scale its gap to the baseline by
        advantages = torch.where(scale > 0, advantages, torch.zeros_like(advantages))
    return (advantages / (scale + eps)).to(dtype)


def clip_advantages(advantages: torch.Tensor, max_abs: float) -> torch.Tensor:
    """Clamp advantages to ``[-max_abs, max_abs]`` (DDPO / Flow-GRPO ``adv_clip_max``)."""
    if not max_abs > 0:
        raise ValueError(f"max_abs must be positive, got {max_abs}")
    return advantages.clamp(-max_abs, max_abs)


def group_reward_statistics(
    rewards: torch.Tensor, groups: torch.Tensor | Sequence[Any] | int
) -> dict[str, float]:
    """Diagnostics of the learning signal a batch carries, per comparison group.

    A group whose rewards are all equal (every sample right, or every one wrong, under a 0/1
    reward) has zero advantage everywhere and contributes no gradient to a group-relative loss;
    the mean within-group standard deviation says how much the group's samples disagree.

    Args:
        rewards: ``[B]`` finite rewards.
        groups: a group size (contiguous groups) or one group id per sample.

    Returns:
        ``{"zero_variance_groups": fraction of groups with max == min,
        "group_reward_std": mean over groups of the population std (ddof 0)}``.
    """
    rewards = rewards.detach().double().cpu().reshape(-1)
    index = _group_index(groups, rewards.shape[0])
    num_groups = int(index.max()) + 1 if index.numel() else 0
    if num_groups == 0:
        return {"zero_variance_groups": float("nan"), "group_reward_std": float("nan")}
    counts = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, torch.ones_like(rewards))
    means = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, rewards) / counts
    variance = torch.zeros(num_groups, dtype=torch.float64).index_add_(
        0, index, (rewards - means[index]) ** 2
    )
    high = torch.full((num_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(
        0, index, rewards, "amax"
    )
    low = torch.full((num_groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, index, rewards, "amin")
    return {
        "zero_variance_groups": float((high == low).double().mean()),
        "group_reward_std": float((variance / counts).sqrt().mean()),
    }


def clustered_stderr(rewards: torch.Tensor, groups: torch.Tensor | Sequence[Any] | int) -> float:
    """The standard error of the mean reward with each group's samples as one cluster.

    A group's samples share a prompt, so their rewards are correlated and ``std / sqrt(n)``
    understates the error of the batch mean (by ``sqrt(1 + (m - 1) rho)`` for groups of ``m`` with
    intra-group correlation ``rho``). This is the cluster-robust (Liang & Zeger 1986) variance of a
    mean with the small-sample factor ``G / (G - 1)``:
    ``Var = G / (G - 1) * sum_g (sum_{i in g} (r_i - mean))^2 / n^2``. With one sample per group it
    equals ``std / sqrt(n)``; with a single group (one prompt) the clusters say nothing, and the
    plain ``std / sqrt(n)`` is returned (the error given that prompt).

    Args:
        rewards: ``[B]`` finite rewards.
        groups: a group size (contiguous groups) or one group id per sample.
    """
    rewards = rewards.detach().double().cpu().reshape(-1)
    n = rewards.shape[0]
    if n < 2:
        return 0.0
    index = _group_index(groups, n)
    num_groups = int(index.max()) + 1
    if num_groups < 2:
        return float(rewards.std(unbiased=True) / math.sqrt(n))
    sums = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, rewards - rewards.mean())
    return float((num_groups / (num_groups - 1) * (sums**2).sum()).sqrt() / n)


class PerPromptStatTracker:
    """Per-prompt reward statistics for advantage normalisation (DDPO, Black et al. 2023, app. B).

    Each prompt keeps the last ``buffer_size`` rewards it received. On :meth:`update`, the batch's
    rewards are appended first, then each reward is normalised by its prompt's buffer mean and std
    — or by the current batch's mean and std while the prompt has fewer than ``min_count``
    entries, so rare prompts do not get advantages from two or three samples.

    The state is plain Python (prompt strings to lists of floats) so that checkpoints can store it
    as JSON.

    Args:
        buffer_size: rewards kept per prompt (oldest evicted first); ``None`` keeps all of them.
        min_count: entries a prompt needs before its own statistics are used.
        eps: added to the std (DDPO uses ``1e-6``).
    """

    def __init__(self, buffer_size: int | None, min_count: int, eps: float = 1e-6) -> None:
        if buffer_size is not None and buffer_size < 1:
            raise ValueError(f"buffer_size must be positive or None, got {buffer_size}")
        if min_count < 0:
            raise ValueError(f"min_count must be non-negative, got {min_count}")
        if buffer_size is not None and min_count > buffer_size:
            raise ValueError(
                f"min_count {min_count} exceeds buffer_size {buffer_size}: prompt statistics would never be used"
            )
        self.buffer_size = buffer_size
        self.min_count = min_count
        self.eps = eps
        self.stats: dict[str, deque[float]] = {}

    def update(self, prompts: Sequence[str], rewards: torch.Tensor | Sequence[float]) -> torch.Tensor:
        """Record ``rewards`` and return their advantages.

        Args:
            prompts: ``B`` prompt strings.
            rewards: float ``[B]`` (tensor, array or list).

        Returns:
            float ``[B]`` advantages: same dtype and device as ``rewards`` when it is a floating
            tensor, else float32 on the CPU.
        """
        prompts = list(prompts)
        values = np.asarray(
            rewards.detach().cpu().double().numpy() if isinstance(rewards, torch.Tensor) else rewards,
            dtype=np.float64,
        )  # [B]
        if values.ndim != 1 or values.shape[0] != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts for rewards of shape {list(values.shape)}")
        for prompt in prompts:
            if not isinstance(prompt, str):
                raise TypeError(f"prompts must be strings, got {type(prompt).__name__}: {prompt!r}")

        batch_mean, batch_std = float(values.mean()), float(values.std())
        prompt_array = np.asarray(prompts, dtype=object)
        advantages = np.empty_like(values)
        for prompt in dict.fromkeys(prompts):
            mask = prompt_array == prompt
            history = self.stats.setdefault(prompt, deque(maxlen=self.buffer_size))
            history.extend(values[mask].tolist())
            if len(history) < self.min_count:
                mean, std = batch_mean, batch_std
            else:
                mean, std = float(np.mean(history)), float(np.std(history))
            advantages[mask] = (values[mask] - mean) / (std + self.eps)

        if isinstance(rewards, torch.Tensor) and rewards.is_floating_point():
            return torch.as_tensor(advantages, dtype=rewards.dtype, device=rewards.device)
        return torch.as_tensor(advantages, dtype=torch.float32)

    def get_stats(self) -> dict[str, dict[str, float]]:
        """Per prompt: ``{"mean", "std", "count"}`` of its buffer."""
        return {
            prompt: {"mean": float(np.mean(history)), "std": float(np.std(history)), "count": len(history)}
            for prompt, history in self.stats.items()
            if history
        }

    def clear(self) -> None:
        """Forget every prompt's history."""
        self.stats.clear()

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: settings and every prompt's buffer, oldest reward first."""
        return {
            "buffer_size": self.buffer_size,
            "min_count": self.min_count,
            "eps": self.eps,
            "stats": {prompt: list(history) for prompt, history in self.stats.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore buffers saved by :meth:`state_dict`.

        The tracker keeps its own ``buffer_size``/``min_count``/``eps``; a saved buffer longer than
        ``buffer_size`` keeps its newest entries.
        """
        for key in ("buffer_size", "min_count"):
            if key in state and state[key] != getattr(self, key):
                logger.warning(
                    "PerPromptStatTracker: saved %s=%s differs from this tracker's %s; keeping %s",
                    key,
                    state[key],
                    getattr(self, key),
                    getattr(self, key),
                )
        self.stats = {
            str(prompt): deque((float(value) for value in history), maxlen=self.buffer_size)
            for prompt, history in state["stats"].items()
        }

    def __repr__(self) -> str:
        return (
            f"PerPromptStatTracker(buffer_size={self.buffer_size}, min_count={self.min_count}, "
            f"prompts={len(self.stats)})"
        )
