"""B2-DiffuRL's schedule, selection and advantages as pure functions (Hu et al., CVPR 2025).

"Towards Better Alignment: Training Diffusion Models with Reinforcement Learning Against Sparse
Rewards" (official code github.com/hu-zijing/B2-DiffuRL). The rollout strategy that uses them is
:mod:`genalign.trainers.strategies.b2diffurl`.

1. **Backward progressive training** (Sec. 4.1): a stage trains the window ``[T - split_step, T)``
   of the chain; ``split_step`` grows over training (:func:`split_step_at`, :func:`train_window`).
2. **Selection** (official ``run_select.py``): rewards are normalised per prompt against the
   rewards of the last ``history_steps`` rounds, ``z = (r - mean) / (std + 1e-8)``
   (:class:`PromptRewardHistory`); in each branch group the best branch is kept if
   ``z >= pos_threshold`` and the worst if ``z < neg_threshold`` (:func:`select_in_branch_groups`).
3. **Weighted advantages** (official ``run_train.py``): ``A = clip(z, -c, c) * w`` with
   ``w = pos_weight`` (beta_1) when ``z > 0`` and ``neg_weight`` (beta_2) otherwise
   (:func:`branch_advantages`).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch

NORMALISATION_EPS = 1e-8  # official run_select.py

__all__ = [
    "PromptRewardHistory",
    "branch_advantages",
    "select_in_branch_groups",
    "split_step_at",
    "train_window",
]


# ----------------------------------------------------------------------------- the schedule
def split_step_at(
    step: int,
    num_steps: int,
    start: int,
    end: int,
    increment: int = 1,
    stage_steps: int | None = None,
) -> int:
    """``split_step`` of training step ``step`` (backward progressive training, Sec. 4.1).

    The values are ``start, start + increment, ...``, capped at ``end`` (so the last is ``end``):
    ``L = ceil((end - start) / increment) + 1`` levels. With ``stage_steps`` each level lasts that
    many steps (the last lasts to the end); without, level ``floor(step * L / num_steps)``,
    the official ``run_process.sh`` rule that spreads the levels evenly over ``num_steps``.
    """
    if not 1 <= start <= end:
        raise ValueError(f"split steps need 1 <= start <= end, got start={start}, end={end}")
    if increment < 1:
        raise ValueError(f"increment must be positive, got {increment}")
    levels = math.ceil((end - start) / increment) + 1
    if stage_steps is None:
        if num_steps <= 0:
            raise ValueError(f"num_steps must be positive, got {num_steps}")
        level = step * levels // num_steps
    else:
        if stage_steps <= 0:
            raise ValueError(f"stage_steps must be positive, got {stage_steps}")
        level = step // stage_steps
    return min(end, start + min(level, levels - 1) * increment)


def train_window(split_step: int, num_inference_steps: int) -> torch.Tensor:
    """The trained step indices ``[T - split_step, T)`` (sampling order: index 0 acts on x_T)."""
    if not 1 <= split_step <= num_inference_steps:
        raise ValueError(f"split_step must lie in [1, {num_inference_steps}], got {split_step}")
    return torch.arange(num_inference_steps - split_step, num_inference_steps)


# ----------------------------------------------------------------------------- selection
class PromptRewardHistory:
    """Per-prompt reward normalisation against the rewards of the last ``history_steps`` steps.

    :meth:`normalise` pools, for each prompt, its rewards of this step with those kept from the
    previous ``history_steps`` steps, returns ``(r - mean) / (std + 1e-8)`` (unbiased std, as
    ``torch.std`` in the official code), then stores this step's rewards. A prompt with a single
    pooled reward has no spread: its normalised reward is 0.
    """

    def __init__(self, history_steps: int) -> None:
        if history_steps < 0:
            raise ValueError(f"history_steps must be >= 0, got {history_steps}")
        self.history_steps = history_steps
        self.steps: deque[dict[str, torch.Tensor]] = deque(maxlen=history_steps)

    def normalise(self, prompts: list[str], rewards: torch.Tensor) -> torch.Tensor:
        """``rewards`` ``[N]`` of ``prompts`` (N strings) -> normalised rewards ``[N]`` fp64."""
        if rewards.ndim != 1 or rewards.shape[0] != len(prompts):
            raise ValueError(f"rewards must have shape [{len(prompts)}], got {list(rewards.shape)}")
        values = rewards.detach().double().cpu()
        current: dict[str, list[int]] = {}
        for i, prompt in enumerate(prompts):
            current.setdefault(prompt, []).append(i)
        out = torch.zeros_like(values)
        this_step = {}
        for prompt, index in current.items():
            mine = values[index]
            this_step[prompt] = mine
            pooled = torch.cat([past[prompt] for past in self.steps if prompt in past] + [mine])
            if pooled.numel() < 2:
                continue
            out[index] = (mine - pooled.mean()) / (pooled.std(unbiased=True) + NORMALISATION_EPS)
        if self.history_steps > 0:
            self.steps.append(this_step)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"steps": [dict(step) for step in self.steps]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps.clear()
        for step in state.get("steps", []):
            self.steps.append({prompt: torch.as_tensor(v, dtype=torch.float64) for prompt, v in step.items()})


def select_in_branch_groups(
    scores: torch.Tensor, branches: int, pos_threshold: float, neg_threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the trained samples of each branch group (official ``run_select.py``).

    Args:
        scores: ``[G * branches]`` normalised rewards, branch group ``g`` at rows
            ``g * branches .. (g + 1) * branches - 1``.
        branches: group size.
        pos_threshold / neg_threshold: keep a group's best if ``>= pos_threshold`` and its worst
            if ``< neg_threshold`` (first index on ties).

    Returns:
        ``index`` ``[K]`` long, the kept rows in increasing order, and ``positive`` ``[K]`` bool
        (True for a kept best).
    """
    if scores.ndim != 1 or branches < 1 or scores.shape[0] % branches != 0:
        raise ValueError(f"scores of shape {list(scores.shape)} do not split into groups of {branches}")
    if neg_threshold > pos_threshold:
        raise ValueError(f"neg_threshold {neg_threshold} exceeds pos_threshold {pos_threshold}")
    groups = scores.reshape(-1, branches)  # (G, branches)
    offset = torch.arange(groups.shape[0]) * branches
    best, worst = groups.argmax(dim=1), groups.argmin(dim=1)  # (G,)
    keep_best = groups.gather(1, best[:, None])[:, 0] >= pos_threshold
    keep_worst = groups.gather(1, worst[:, None])[:, 0] < neg_threshold
    rows = torch.cat([(offset + best)[keep_best], (offset + worst)[keep_worst]])
    positive = torch.cat(
        [
            torch.ones(int(keep_best.sum()), dtype=torch.bool),
            torch.zeros(int(keep_worst.sum()), dtype=torch.bool),
        ]
    )
    order = torch.argsort(rows)
    return rows[order], positive[order]


def branch_advantages(
    scores: torch.Tensor, clip: float, pos_weight: float, neg_weight: float
) -> torch.Tensor:
    """``A = clip(z, -clip, clip) * (pos_weight if z > 0 else neg_weight)`` (official ``run_train.py``)."""
    weight = torch.where(scores > 0, torch.full_like(scores, pos_weight), torch.full_like(scores, neg_weight))
    return scores.clamp(-clip, clip) * weight
