"""What the toy-model recipes share: the optimisation loop, the learning-rate schedule, the EMA of
the saved weights, progress logging, sizes and parameter counts, and the model-card files.

The recipes themselves are :mod:`genalign.toy.generators` (toy-sd, toy-lcm, toy-flow and their
VAE) and :mod:`genalign.toy.reward_models` (toy-clip, toy-vlm).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from genalign.trainers.ema import ParameterEMA

logger = logging.getLogger(__name__)

__all__ = [
    "AveragedTraining",
    "ParameterEMA",
    "TrainingLog",
    "adamw_warmup_cosine",
    "averaged_modules",
    "ema_warmup",
    "folder_megabytes",
    "load_averages",
    "optimise",
    "optimise_module",
    "parameter_count",
    "snapshots",
    "step_schedule",
    "torch_threads",
    "training_progress",
    "warmup_cosine",
    "write_card_files",
]


# -- sizes ----------------------------------------------------------------------------------------


def parameter_count(modules: torch.nn.Module | Sequence[torch.nn.Module]) -> int:
    """Number of parameters of a module or of a list of modules."""
    if isinstance(modules, torch.nn.Module):
        modules = [modules]
    return sum(p.numel() for module in modules for p in module.parameters())


def folder_megabytes(path: str | Path, megabyte: float = 2**20, ndigits: int | None = 2) -> float:
    """Size of a model folder in units of ``megabyte`` bytes (MiB by default), without a training
    run's ``snapshot`` sub-folder (not shipped); rounded to ``ndigits`` (None: not rounded)."""
    path = Path(path)
    files = [f for f in path.rglob("*") if f.is_file() and "snapshot" not in f.relative_to(path).parts]
    size = sum(f.stat().st_size for f in files) / megabyte
    return size if ndigits is None else round(size, ndigits)


def write_card_files(folder: str | Path, card: dict[str, Any], readme: str) -> None:
    """A model card: ``card.json`` (the record) and ``README.md`` (its prose rendering)."""
    folder = Path(folder)
    (folder / "card.json").write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    (folder / "README.md").write_text(readme, encoding="utf-8")


# -- schedule, threads, logging ---------------------------------------------------------------------


def warmup_cosine(step: int, progress: float, warmup: int) -> float:
    """Learning-rate factor: linear warm-up over ``warmup`` steps, then cosine decay to a tenth
    over the training ``progress`` (0 -> 1, clipped)."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def training_progress(step: int, steps: int, start: float, max_minutes: float | None) -> float:
    """Fraction of training done: by steps, or by wall-clock time since ``start`` when the
    ``max_minutes`` budget runs out first."""
    progress = step / steps
    if max_minutes:
        progress = max(progress, (time.time() - start) / (60 * max_minutes))
    return progress


def step_schedule(warmup: int, total: int, minutes: float | None = None) -> Callable[[int], float]:
    """:func:`warmup_cosine` as a ``LambdaLR`` function of the step, decaying over ``total`` steps,
    or over ``minutes`` of wall-clock time from the first call if that runs out first
    (:func:`training_progress`): a run bounded by time still ends at the bottom of its cosine."""
    clock: list[float] = []

    def schedule(step: int) -> float:
        if not clock:
            clock.append(time.time())
        done = max(0, step - warmup)
        progress = training_progress(done, max(1, total - warmup), clock[0], minutes)
        return warmup_cosine(step, progress, warmup)

    return schedule


def adamw_warmup_cosine(
    parameters: Sequence[torch.Tensor],
    lr: float,
    steps: int,
    weight_decay: float,
    max_warmup: int,
    minutes: float | None = None,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """AdamW with :func:`step_schedule`: warm-up over ``min(max_warmup, steps // 10 + 1)`` steps,
    then cosine decay to a tenth of ``lr`` at ``steps`` (or after ``minutes``, if sooner)."""
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
    warmup = min(max_warmup, steps // 10 + 1)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, step_schedule(warmup, steps, minutes))


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run with ``torch.set_num_threads(threads)`` (None or 0: unchanged), restored on exit."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class TrainingLog:
    """Keeps the mean loss of every ``every`` steps (``history``) and logs it with the elapsed time."""

    def __init__(self, every: int, total: int, name: str) -> None:
        self.every, self.total, self.name = every, total, name
        self.start = time.time()
        self.losses: list[float] = []
        self.history: list[float] = []

    def __call__(self, step: int, loss: float) -> None:
        self.losses.append(loss)
        if (step + 1) % self.every == 0 or step + 1 == self.total:
            mean = float(np.mean(self.losses))
            self.history.append(mean)
            self.losses.clear()
            if self.every < self.total:
                elapsed = time.time() - self.start
                logger.info(
                    "[%s] step %d/%d loss %.4f (%.0fs)", self.name, step + 1, self.total, mean, elapsed
                )


# -- the loop -------------------------------------------------------------------------------------


def averaged_modules(ema: ParameterEMA, modules: Sequence[torch.nn.Module]) -> list[torch.nn.Module]:
    """Frozen copies of ``modules`` (taken now: attention processors set later on ``modules`` are not
    theirs) holding the EMA's averages; ``ema`` tracks the modules' parameters in order.
    :func:`load_averages` refreshes them."""
    copies = [copy.deepcopy(m).requires_grad_(False).eval() for m in modules]
    load_averages(ema, copies)
    return copies


def load_averages(ema: ParameterEMA, modules: Sequence[torch.nn.Module]) -> list[torch.nn.Module]:
    """Copy the EMA's averages into the parameters of ``modules`` (in order); returns ``modules``."""
    ema.copy_to([p for m in modules for p in m.parameters()])
    return list(modules)


def optimise(
    loss_fn: Callable[[int], torch.Tensor],
    parameters: Sequence[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    steps: int,
    log: TrainingLog,
    ema: ParameterEMA | None = None,
    ema_decay: Callable[[int], float] | None = None,
    max_minutes: float | None = None,
    after_step: Callable[[int], None] | None = None,
) -> int:
    """The recipes' optimisation loop; returns the number of steps done.

    Per step: ``loss_fn(step)`` (which draws its batch), backward, gradient norm clipped to 1,
    optimiser and schedule steps, then the EMA of the parameters (decay ``ema_decay(step)``),
    the log and ``after_step(steps done)``. ``max_minutes`` stops early (the schedule still assumes
    ``steps``).
    """
    start = time.time()
    done = 0
    for step in range(steps):
        loss = loss_fn(step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        scheduler.step()
        if ema is not None:
            if ema_decay is not None:
                ema.decay = ema_decay(step)
            ema.step()
        log(step, loss.item())
        done = step + 1
        if after_step is not None:
            after_step(done)
        if max_minutes is not None and time.time() - start > 60 * max_minutes:
            logger.info("[%s] stopping at step %d: %s minutes", log.name, done, max_minutes)
            break
    return done


def optimise_module(
    module: torch.nn.Module,
    loss_fn: Callable[[int], torch.Tensor],
    lr: float,
    steps: int,
    log: TrainingLog,
    max_warmup: int,
    max_minutes: float | None = None,
) -> int:
    """:func:`optimise` of all of ``module``'s parameters without an EMA (the autoencoders' recipes):
    AdamW without weight decay (:func:`adamw_warmup_cosine`), ``module`` in training mode while it
    runs and in eval mode after. Returns the number of steps done."""
    parameters = list(module.parameters())
    optimizer, scheduler = adamw_warmup_cosine(parameters, lr, steps, weight_decay=0.0, max_warmup=max_warmup)
    module.train()
    done = optimise(loss_fn, parameters, optimizer, scheduler, steps, log, max_minutes=max_minutes)
    module.eval()
    return done


def ema_warmup(decay: float) -> Callable[[int], float]:
    """The EMA decay of step ``k``: ``min(decay, (1 + k) / (10 + k))``, so early averages forget
    the random initialisation quickly (the warm-up of TensorFlow's ExponentialMovingAverage)."""
    return lambda step: min(decay, (1 + step) / (10 + step))


@dataclass
class AveragedTraining:
    """The training state the toy generators' recipes share: AdamW with warm-up and cosine decay
    (:func:`adamw_warmup_cosine`) on the trainable parameters of ``modules``, an EMA of all their
    parameters, and frozen copies of the modules that hold the averages (what the recipes save).

    Build it with :meth:`of`, train with :meth:`run`, read the averages with :meth:`averages`.
    """

    params: list[torch.Tensor]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    ema: ParameterEMA
    averaged: list[torch.nn.Module]
    ema_decay: Callable[[int], float] | None

    @classmethod
    def of(
        cls,
        modules: Sequence[torch.nn.Module],
        lr: float,
        steps: int,
        ema_decay: float,
        max_warmup: int,
        weight_decay: float = 0.01,
        warm_ema: bool = True,
        schedule_minutes: float | None = None,
    ) -> AveragedTraining:
        """``warm_ema``: the decay follows :func:`ema_warmup` (else it stays ``ema_decay``).
        ``schedule_minutes``: the cosine also ends after this many minutes (:func:`step_schedule`)."""
        modules = list(modules)
        params = [p for m in modules for p in m.parameters() if p.requires_grad]
        optimizer, scheduler = adamw_warmup_cosine(
            params, lr, steps, weight_decay, max_warmup, schedule_minutes
        )
        ema = ParameterEMA([p for m in modules for p in m.parameters()], ema_decay)
        averaged = averaged_modules(ema, modules)
        return cls(params, optimizer, scheduler, ema, averaged, ema_warmup(ema_decay) if warm_ema else None)

    def run(
        self,
        loss_fn: Callable[[int], torch.Tensor],
        steps: int,
        log: TrainingLog,
        max_minutes: float | None = None,
        after_step: Callable[[int], None] | None = None,
    ) -> int:
        """:func:`optimise` with this state; returns the number of steps done."""
        return optimise(
            loss_fn, self.params, self.optimizer, self.scheduler, steps, log, self.ema, self.ema_decay,
            max_minutes, after_step,
        )  # fmt: skip

    def averages(self) -> list[torch.nn.Module]:
        """The frozen copies, refreshed with the current averages."""
        return load_averages(self.ema, self.averaged)


def snapshots(
    out: str | Path | None, every: int | None, save: Callable[[Path, int], object]
) -> Callable[[int], None]:
    """An ``after_step`` callback for :func:`optimise`: ``save(out / "snapshot", steps done)`` every
    ``every`` steps (nothing when ``out`` or ``every`` is unset), so a long run can be evaluated
    while it trains."""

    def snapshot(done: int) -> None:
        if every and out is not None and done % every == 0:
            save(Path(out) / "snapshot", done)

    return snapshot
