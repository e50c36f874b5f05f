"""The training budget the toy generators' recipes share: steps, batch size, learning rate, data,
seed, logging, a time limit, the EMA decay and snapshots, written and documented once here.

Each recipe (:func:`~genalign.toy.generators.train.train_vae`, ``train_sd``, ``train_lcm``,
:func:`~genalign.toy.generators.flow.train_flow`,
:func:`~genalign.toy.generators.video.train_video_vae`,
:func:`~genalign.toy.generators.video_train.train_ar_video`) takes a whole ``budget`` (default its
own, e.g. ``SD_BUDGET``) and each field it uses as a keyword of its own (``steps=3``), resolved by
:func:`recipe_budget`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class TrainBudget:
    """What a toy generator's training run spends, the same in every recipe.

    - ``steps``: optimiser steps; the learning-rate schedule spans them, also when ``max_minutes``
      stops the run early.
    - ``batch_size``: training examples per step.
    - ``lr``: the peak learning rate (AdamW with warmup and cosine decay).
    - ``num_examples``: how many renders (the keyword ``num_images`` of the image recipes) or
      videos (``num_videos``, the video recipes) the training set has, drawn with a seed derived
      from ``seed``.
    - ``seed``: seeds torch, the training set and the draws of every step.
    - ``log_every``: the mean loss of every that many steps is logged and kept (``loss_history``).
    - ``max_minutes``: stop after that many minutes of training (None: all ``steps``).
    - ``ema_decay``: the decay of the exponential moving average of the weights that the recipe
      saves (the recipes that keep one; None in the others).
    - ``snapshot_every``: with an output folder, the averaged weights are also saved as a pipeline
      under ``out/snapshot`` every that many steps, so a long run can be evaluated while it trains
      (None: never).
    """

    steps: int
    batch_size: int
    lr: float
    num_examples: int
    seed: int = 0
    log_every: int = 100
    max_minutes: float | None = None
    ema_decay: float | None = None
    snapshot_every: int | None = None


def recipe_budget(
    recipe: str,
    budget: TrainBudget,
    keywords: Mapping[str, Any],
    data: str = "num_images",
    unused: Collection[str] = (),
) -> TrainBudget:
    """``budget`` with a recipe's budget ``keywords`` applied: each field by its own name, but
    ``num_examples`` by ``data`` (``num_images`` or ``num_videos``). ``unused``: the fields that the
    recipe ``recipe`` (its name, for the messages) does not use. A keyword that names no field, or
    an unused one, is a TypeError, as Python's own for an unexpected keyword argument; so is a
    budget that sets an unused field, or leaves a used ``ema_decay`` unset."""
    names = {(data if f.name == "num_examples" else f.name): f.name for f in fields(TrainBudget)}
    for keyword in keywords:
        if keyword not in names or names[keyword] in unused:
            raise TypeError(f"{recipe}() got an unexpected keyword argument {keyword!r}")
    budget = replace(budget, **{names[keyword]: value for keyword, value in keywords.items()})
    for name in unused:
        if getattr(budget, name) is not None:
            raise TypeError(f"{recipe}() does not use a budget's {name}, but it is {getattr(budget, name)!r}")
    if "ema_decay" not in unused and budget.ema_decay is None:
        raise TypeError(f"{recipe}() needs a budget with an ema_decay")
    return budget
