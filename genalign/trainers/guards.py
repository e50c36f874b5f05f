"""Guards that keep non-finite numbers out of the weights and out of checkpoints.

One ``-inf`` reward is enough to poison a run: group normalisation turns it into NaN advantages,
the NaN reaches every LoRA tensor through one optimizer step, and the poisoned weights are saved
as the latest checkpoint (issue 23). Three guards stop it at each stage:

1. :func:`skip_nonfinite_rewards`: a step whose global rewards hold a NaN or an infinity is
   skipped before advantages (or a strategy's history, e.g. DDPO's stat tracker) see them;
   :meth:`RolloutStrategy.collect <genalign.trainers.strategies.base.RolloutStrategy.collect>`
   calls it between every strategy's sampling and its advantages.
2. :func:`gradients_are_finite`: an optimizer step whose gradient norm is not finite (a NaN or
   infinite loss) is not applied.
3. :func:`nonfinite_tensors`: a checkpoint is never written from non-finite weights
   (:class:`NonFiniteWeightsError`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

__all__ = [
    "NonFiniteWeightsError",
    "count_nonfinite",
    "gradients_are_finite",
    "nonfinite_tensors",
    "skip_nonfinite_rewards",
]


class NonFiniteWeightsError(FloatingPointError):
    """Trainable weights hold NaN or infinite values; nothing is saved from them."""


def count_nonfinite(values: torch.Tensor) -> int:
    """How many entries of ``values`` are NaN, +inf or -inf."""
    return int((~torch.isfinite(values.detach().float())).sum())


def skip_nonfinite_rewards(batch: Any, what: str = "rewards") -> bool:
    """Mark ``batch`` skipped when its ``global_rewards`` hold NaN or +-inf; return whether it did.

    The reason names how many rewards of each kind and which samples (global positions), so a
    user can find the reward that failed. ``batch`` is a
    :class:`~genalign.trainers.strategies.RolloutBatch` (any object with ``global_rewards``,
    ``skipped`` and ``reason``).
    """
    rewards = batch.global_rewards.detach().float()  # (B_global,)
    bad = ~torch.isfinite(rewards)
    if not bad.any():
        return False
    kinds = {
        "NaN": int(torch.isnan(rewards).sum()),
        "+inf": int(torch.isposinf(rewards).sum()),
        "-inf": int(torch.isneginf(rewards).sum()),
    }
    counts = ", ".join(f"{n} {kind}" for kind, n in kinds.items() if n)
    batch.skipped = True
    batch.reason = (
        f"{int(bad.sum())} of {rewards.numel()} {what} are not finite ({counts}; "
        f"samples {bad.nonzero().flatten().tolist()})"
    )
    return True


def gradients_are_finite(norm: torch.Tensor | float) -> bool:
    """Whether a total gradient norm (as returned by ``clip_grad_norm_``) is finite.

    A single NaN or infinite gradient entry makes the total norm NaN or inf, so one check of the
    norm covers every parameter.
    """
    return math.isfinite(float(norm))


def nonfinite_tensors(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the tensors that hold a NaN or an infinity (floating-point tensors only)."""
    return [
        name
        for name, tensor in tensors.items()
        if torch.is_tensor(tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())
    ]
