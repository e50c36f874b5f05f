"""Trainers: the RL loop (rollout -> score -> advantage -> update), strategies and losses."""

from __future__ import annotations

from genalign.trainers.checkpoint import Checkpoint, latest_checkpoint, load_checkpoint, save_checkpoint
from genalign.trainers.ema import ParameterEMA

__all__ = ["Checkpoint", "ParameterEMA", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]
