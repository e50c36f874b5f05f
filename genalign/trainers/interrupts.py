"""Interruptions that keep the run: SIGTERM / Ctrl-C stop after the step, a failed step saves.

Without these a preemption, a Ctrl-C or a reward that raises lost every step since the last
periodic checkpoint (issue 23.3). Two pieces, both used by :meth:`Trainer.train`:

* :class:`GracefulStop` — while training, SIGTERM and SIGINT only set a flag; the trainer
  finishes the current step, writes a checkpoint and returns (``trainer.interrupted`` names the
  signal). A second Ctrl-C raises :class:`KeyboardInterrupt` at once, for a user who cannot wait.
* :class:`StepSnapshot` — what a step may change before its first optimizer step (the
  strategy's state, e.g. DDPO's stat tracker; the RNG; an fp16 run's loss scale, which an
  overflow-skipped step halves), taken at the start of every step. When
  the step raises (a reward or loss exception) before any optimizer step, the snapshot restores
  the state of the last good step and a checkpoint of it is written, so ``resume=latest``
  continues exactly where an uninterrupted run would. A step that raises after an optimizer step
  has half-updated weights; nothing is saved from it (the previous checkpoint stands).
"""

from __future__ import annotations

import copy
import logging
import signal
import threading
from typing import TYPE_CHECKING, Any

from genalign.trainers.checkpoint import capture_rng_state

if TYPE_CHECKING:
    from genalign.trainers.trainer import Trainer

logger = logging.getLogger(__name__)

__all__ = ["GracefulStop", "StepSnapshot"]


class GracefulStop:
    """Context manager: SIGTERM / SIGINT request a stop at the end of the step.

    Handlers are installed only in the main thread (Python allows no other) and the previous ones
    are restored on exit. ``requested`` holds the first signal's number (``None``: none came).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now, no checkpoint
        if self.requested is None:
            logger.warning(
                "%s received: finishing the current step, then saving a checkpoint "
                "(press Ctrl-C again to stop at once)",
                signal.Signals(signum).name,
            )
        self.requested = signum

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


class StepSnapshot:
    """The trainer state a step may change before its first optimizer step, taken at its start."""

    def __init__(self, trainer: Trainer) -> None:
        self.step = trainer.step
        self.optimizer_steps = trainer.optimizer_steps
        self.rng_state = capture_rng_state()
        self.strategy_state = copy.deepcopy(trainer.strategy.state_dict())
        self.history_length = len(trainer.history)
        scale = trainer.loss_scale
        self.loss_scale_state = scale.state_dict() if scale is not None else None

    def save_after_failure(self, trainer: Trainer, error: BaseException) -> None:
        """Write a checkpoint of the last good step after ``error`` ended this step, where safe."""
        if trainer.accelerator.num_processes > 1:  # a save is collective: the other processes may not come
            logger.error("step %d failed (%s); not saving across processes", self.step, error)
            return
        if trainer.optimizer_steps != self.optimizer_steps:
            logger.error(
                "step %d failed after updating the weights (%s); its state is not saved, the latest "
                "checkpoint stands",
                self.step,
                error,
            )
            return
        trainer.strategy.load_state_dict(copy.deepcopy(self.strategy_state))
        if self.loss_scale_state is not None:
            trainer.loss_scale.load_state_dict(self.loss_scale_state)
        del trainer.history[self.history_length :]
        if trainer.saved_step == self.step:
            return  # the last good step is already on disk
        try:
            path = trainer.save(rng_state=self.rng_state)
        except Exception as save_error:  # report the step's own error, not this one
            logger.error("could not save a checkpoint after step %d failed: %s", self.step, save_error)
            return
        logger.error("step %d failed (%s); saved the last good step as %s", self.step, error, path)
