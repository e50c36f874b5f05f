"""Learning-rate schedules as pure multiplicative factors of the base learning rate.

``learning_rate_factor(n, ...)`` is the factor after ``n`` optimiser steps, for
``torch.optim.lr_scheduler.LambdaLR``: a linear warm-up ``min(1, (n + 1) / warmup_steps)`` times
the schedule's decay, ``1`` (``"constant"``, DDPO's and Flow-GRPO's) or
``max(0, 1 - max(0, n - warmup_steps) / (decay_steps - warmup_steps))`` (``"linear"``: RLCM's
``LinearLR(start_factor=1, end_factor=0)``, Oertell et al. 2024, code release, which has no
warm-up; with one, the decay starts after it, as transformers' linear schedule with warm-up) or ``step_factor ** (n // step_every)`` (``"step"``: RLRF's
learning rate "decayed by 70% every 100 steps", Rodriguez et al. 2025, as quoted publicly) or
``(1 + cos(pi * min(1, (n - warmup_steps) / (decay_steps - warmup_steps)))) / 2`` (``"cosine"``:
transformers' ``get_cosine_schedule_with_warmup``, Q-Hawkeye's schedule; 1 during the warm-up).
"""

from __future__ import annotations

import math

LR_SCHEDULES = ("constant", "linear", "step", "cosine")


def learning_rate_factor(
    optimizer_steps: int,
    warmup_steps: int = 0,
    schedule: str = "constant",
    decay_steps: int | None = None,
    step_every: int = 100,
    step_factor: float = 0.3,
) -> float:
    """The learning-rate factor after ``optimizer_steps`` steps (module docstring).

    Args:
        optimizer_steps: optimiser steps taken so far (``n >= 0``).
        warmup_steps: linear warm-up length (0: none).
        schedule: ``"constant"``, ``"linear"`` (decays to 0 at ``decay_steps``), ``"step"`` or
            ``"cosine"`` (to 0 at ``decay_steps``).
        decay_steps: steps at which a linear schedule reaches 0; required for ``"linear"``.
        step_every, step_factor: a ``"step"`` schedule multiplies by ``step_factor`` after every
            ``step_every`` optimiser steps.
    """
    warmup = min(1.0, (optimizer_steps + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    if schedule == "constant":
        return warmup
    if schedule == "linear":
        if decay_steps is None or decay_steps <= 0:
            raise ValueError(f"a linear schedule needs positive decay_steps, got {decay_steps}")
        span = max(1, decay_steps - warmup_steps)
        return warmup * max(0.0, 1.0 - max(0, optimizer_steps - warmup_steps) / span)
    if schedule == "step":
        if step_every <= 0:
            raise ValueError(f"a step schedule needs positive step_every, got {step_every}")
        return warmup * step_factor ** (optimizer_steps // step_every)
    if schedule == "cosine":
        if decay_steps is None or decay_steps <= 0:
            raise ValueError(f"a cosine schedule needs positive decay_steps, got {decay_steps}")
        span = max(1, decay_steps - warmup_steps)
        progress = min(1.0, max(0.0, (optimizer_steps - warmup_steps) / span))
        return warmup * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"schedule must be one of {LR_SCHEDULES}, got {schedule!r}")
