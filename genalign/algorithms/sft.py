"""The next-token loss of supervised fine-tuning on target tokens only.

RLRF's stage 1 ("SVG-SFT", Rodriguez et al. 2025, arXiv 2505.20793, Sec. 3.1) minimises
``L = -sum_l log p_theta(x_l | x_<l, I)`` over the tokens ``x`` of the ground-truth SVG given
the image ``I``. Over a padded batch the sum runs over the target tokens (``mask == 1``) only;
prompt and padding positions never count. :func:`next_token_loss` normalises it as
``"token_mean"`` (the sum over all target tokens of the batch divided by their count: what
transformers' causal-LM loss computes with ``-100`` labels) or ``"sequence_mean"`` (each target's
token mean, then the mean over targets).
"""

from __future__ import annotations

import torch

__all__ = ["SFT_AGGREGATIONS", "next_token_loss"]

SFT_AGGREGATIONS = ("token_mean", "sequence_mean")


def next_token_loss(
    log_probs: torch.Tensor, mask: torch.Tensor, aggregation: str = "token_mean"
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Negative log-likelihood of the target tokens.

    Args:
        log_probs: ``[B, L]`` ``log p(x_l | x_<l)`` of each target position (any value where the
            mask is 0).
        mask: ``[B, L]`` 1 on target tokens, 0 on padding.
        aggregation: ``"token_mean"`` or ``"sequence_mean"`` (module docstring).

    Returns:
        ``(loss, info)``: the scalar loss and ``{"nll_token_mean", "target_tokens"}`` (the token
        mean whatever the aggregation, for logging, and the number of target tokens).
    """
    if aggregation not in SFT_AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {SFT_AGGREGATIONS}, got {aggregation!r}")
    weights = mask.to(log_probs.dtype)
    nll = -torch.where(weights > 0, log_probs, torch.zeros_like(log_probs)) * weights  # (B, L)
    tokens = weights.sum()
    token_mean = nll.sum() / tokens.clamp_min(1.0)
    if aggregation == "token_mean":
        loss = token_mean
    else:
        loss = (nll.sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)).mean()
    return loss, {"nll_token_mean": token_mean.detach(), "target_tokens": tokens.detach()}
