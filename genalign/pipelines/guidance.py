"""Two-branch guided predictions, written once for every pipeline.

Classifier-free guidance (Ho & Salimans 2022) and RLG (Jin et al. 2025) are the same
extrapolation between two predictions of one step,

    u + g (c - u)

with ``(u, c) = (unconditional, conditional)`` and ``g`` the guidance scale for CFG, and
``(u, c) = (reference, RL-tuned)`` and ``g = w`` for RLG (the paper's RLG update).
"""

from __future__ import annotations

import torch

__all__ = ["apply_guidance", "cfg_batch", "guided_prediction", "rlg_combine"]


def guided_prediction(uncond: torch.Tensor, cond: torch.Tensor, guidance_scale: float) -> torch.Tensor:
    """``uncond + guidance_scale * (cond - uncond)``: two predictions of one step, same shape."""
    return uncond + guidance_scale * (cond - uncond)


def cfg_batch(negative: torch.Tensor | None, positive: torch.Tensor, do_cfg: bool = True) -> torch.Tensor:
    """The ``[uncond; cond]`` batch ``[2B, ...]`` of a conditioning tensor (prompt embeds, pooled
    embeds, attention mask) that :func:`apply_guidance` later splits; ``positive`` ``[B, ...]``
    alone without ``do_cfg``."""
    return torch.cat([negative, positive]) if do_cfg else positive


def apply_guidance(prediction: torch.Tensor, guidance_scale: float, do_cfg: bool = True) -> torch.Tensor:
    """Classifier-free guidance on a ``[uncond; cond]`` batch ``[2B, ...]``: ``u + g (c - u)``, ``[B, ...]``.

    Without ``do_cfg`` the prediction is a plain ``[B, ...]`` batch and is returned as is.
    """
    if not do_cfg:
        return prediction
    uncond, cond = prediction.chunk(2)
    return guided_prediction(uncond, cond, guidance_scale)


def rlg_combine(reference: torch.Tensor, rl: torch.Tensor, rlg_scale: float) -> torch.Tensor:
    """RLG's combination (Jin et al. 2025): ``v_ref + w (v_RL - v_ref)``.

    Both inputs are the CFG-guided predictions of one step, same shape. ``w = 0`` returns
    ``reference`` and ``w = 1`` returns ``rl`` exactly (no rounding).
    """
    if rlg_scale == 0.0:
        return reference
    if rlg_scale == 1.0:
        return rl
    return guided_prediction(reference, rl, rlg_scale)
