"""Per-step diagnostics of an update that need the weights themselves (issue 21's study).

The reward-side diagnostics (zero-variance groups, within-group reward std) are pure functions of
the rewards and live in :mod:`genalign.algorithms.advantages`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["parameter_change", "snapshot"]


def snapshot(parameters: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Detached copies of ``parameters`` (one extra copy of the trainable weights in memory)."""
    return [p.detach().clone() for p in parameters]


def parameter_change(before: Sequence[torch.Tensor], after: Sequence[torch.Tensor]) -> dict[str, float]:
    """How far an update moved the weights.

    Returns:
        ``{"param_change": RMS of (after - before) over all elements,
        "param_change_rel": ||after - before|| / ||before|| (NaN when ||before|| = 0)}``.
    """
    squared_change, squared_norm, count = 0.0, 0.0, 0
    for old, new in zip(before, after, strict=True):
        squared_change += float((new.detach().float() - old.float()).pow(2).sum())
        squared_norm += float(old.float().pow(2).sum())
        count += old.numel()
    return {
        "param_change": math.sqrt(squared_change / max(count, 1)),
        "param_change_rel": math.sqrt(squared_change / squared_norm) if squared_norm > 0 else float("nan"),
    }
