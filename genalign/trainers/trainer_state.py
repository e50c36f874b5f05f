"""Saving and restoring a :class:`~genalign.trainers.trainer.Trainer`'s whole state.

:func:`save_trainer` writes everything a resume needs (weights, optimizer, scheduler, RNG, the
strategy's and the loss's states, EMA, an fp16 run's loss scale) through :func:`~genalign.trainers.checkpoint.save_checkpoint`,
never from non-finite weights; :func:`resume_trainer` restores it, from the newest intact
checkpoint under ``resume=latest``. Under FSDP the full states are gathered on every process
(collectives) and written by the main one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from genalign.trainers.checkpoint import (
    capture_rng_state,
    load_checkpoint,
    load_latest_intact,
    restore_rng_state,
    save_checkpoint,
)
from genalign.trainers.guards import NonFiniteWeightsError, nonfinite_tensors

if TYPE_CHECKING:
    from genalign.trainers.trainer import Trainer

logger = logging.getLogger(__name__)

__all__ = ["resume_trainer", "save_trainer", "trainable_state"]


def trainable_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Full CPU copies of the trainable weights (a collective under FSDP)."""
    from genalign.trainers.distributed import full_state

    return full_state(trainer.policy.named_trainable_parameters())


def _optimizer_state(trainer: Trainer) -> dict[str, Any]:
    if trainer.sharded:
        from genalign.trainers.distributed import full_optimizer_state

        return full_optimizer_state(trainer.policy.trained_module, trainer.optimizer)
    return trainer.optimizer.state_dict()


def _ema_state(trainer: Trainer) -> dict[str, Any]:
    from genalign.trainers.distributed import full_tensor

    state = trainer.ema.state_dict()
    state["shadow_params"] = [full_tensor(t).cpu() for t in state["shadow_params"]]
    return state


def save_trainer(trainer: Trainer, rng_state: Any | None = None) -> Path | None:
    """Write an atomic checkpoint of everything needed to resume (main process only).

    ``rng_state``: the RNG state to store (default: the current one).
    """
    path = None
    # gathered on every process (collectives under FSDP), written by the main one
    tensors = {"trainable": trainable_state(trainer)}
    poisoned = nonfinite_tensors(tensors["trainable"])
    if poisoned:
        raise NonFiniteWeightsError(
            f"not saving a checkpoint at step {trainer.step}: {len(poisoned)} trainable tensors hold "
            f"NaN or inf (e.g. {poisoned[0]}); the previous checkpoint stays the latest"
        )
    loss_state = trainer.loss.state_dict()
    if loss_state:
        tensors["loss"] = loss_state  # e.g. DiffusionNFT's old policy
    optimizer_state = _optimizer_state(trainer)
    ema_state = _ema_state(trainer) if trainer.ema is not None else None
    if trainer.is_main_process:
        states = {"strategy": trainer.strategy.state_dict()}
        if ema_state is not None:
            states["ema"] = ema_state
        if trainer.loss_scale is not None:  # fp16: the scale and its good-step count
            states["loss_scale"] = trainer.loss_scale.state_dict()
        path = save_checkpoint(
            trainer.run_dir,
            trainer.step,
            tensors=tensors,
            optimizer_state=optimizer_state,
            scheduler_state=trainer.lr_scheduler.state_dict(),
            rng_state=rng_state if rng_state is not None else capture_rng_state(),
            states=states,
            extra={"optimizer_steps": trainer.optimizer_steps},
            keep_last=trainer.config.logging.keep_last,
            recipe_name=trainer.config.name,
            recipe_fingerprint=trainer.fingerprint,
            recipe_data=trainer.config.fingerprint_data(trainer.prompts),
        )
        logger.info("saved checkpoint %s", path)
    trainer.accelerator.wait_for_everyone()
    trainer.saved_step = trainer.step
    return path


def resume_trainer(trainer: Trainer, where: str) -> None:
    """Continue from ``"latest"`` (in the run folder) or a checkpoint folder."""
    fingerprint = trainer.fingerprint
    data = trainer.config.fingerprint_data(trainer.prompts)
    if where == "latest":  # the newest intact one: damaged ones are skipped with a warning
        checkpoint = load_latest_intact(trainer.run_dir, expected_recipe=fingerprint, expected_data=data)
    else:
        checkpoint = load_checkpoint(Path(where), expected_recipe=fingerprint, expected_data=data)
    if checkpoint is None:  # nothing to continue: a fresh run, without the earlier run's metric lines
        logger.warning(
            "resume=latest: no checkpoint in %s yet; starting a fresh run at step 0", trainer.run_dir
        )
        trainer._truncate_metrics(0)
        return
    path = checkpoint.path
    named = trainer.policy.named_trainable_parameters()
    saved = checkpoint.tensors["trainable"]
    missing = sorted(set(named) - set(saved))
    if missing:
        raise ValueError(f"checkpoint {path} lacks trainable parameters {missing[:5]}")
    from genalign.trainers.distributed import load_full_into, load_full_optimizer_state

    load_full_into(named, saved)
    if trainer.sharded:
        load_full_optimizer_state(
            trainer.policy.trained_module, trainer.optimizer, checkpoint.optimizer_state
        )
    else:
        trainer.optimizer.load_state_dict(checkpoint.optimizer_state)
    trainer.lr_scheduler.load_state_dict(checkpoint.scheduler_state)
    trainer.strategy.load_state_dict(checkpoint.states.get("strategy", {}))
    if "loss" in checkpoint.tensors:
        trainer.loss.load_state_dict(checkpoint.tensors["loss"])
    if trainer.ema is not None and "ema" in checkpoint.states:
        ema_state = dict(checkpoint.states["ema"])
        if trainer.sharded:
            from genalign.trainers.distributed import shard_like

            ema_state["shadow_params"] = [
                shard_like(saved, current)
                for saved, current in zip(ema_state["shadow_params"], trainer.ema.shadow_params)
            ]
        trainer.ema.load_state_dict(ema_state)
    if trainer.loss_scale is not None and "loss_scale" in checkpoint.states:
        trainer.loss_scale.load_state_dict(checkpoint.states["loss_scale"])
    if checkpoint.rng_state is not None:
        restore_rng_state(checkpoint.rng_state)
    trainer.step = trainer.saved_step = checkpoint.step
    trainer.optimizer_steps = int(checkpoint.extra.get("optimizer_steps", 0))
    trainer._truncate_metrics(trainer.step)
    logger.info("resumed from %s at step %d", path, trainer.step)
