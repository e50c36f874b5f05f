"""Token-level clipped policy gradient for language policies (GRPO, DAPO, Dr. GRPO), pure math.

A language policy's action is one token; a completion of ``T`` tokens carries one sequence-level
advantage ``A_i`` (group-relative, as in GRPO: Shao et al. 2024, "DeepSeekMath", eq. 3), repeated
over its tokens. Per completion token ``t`` of sequence ``i``, with ``rho = exp(log pi_theta -
log pi_old)``::

    l_it = max(-A_i rho_it, -A_i clip(rho_it, 1 - eps_low, 1 + eps_high)) + beta * k3_it

where ``k3 = pi_ref / pi_theta - 1 - log(pi_ref / pi_theta)`` is the unbiased, non-negative KL
estimator GRPO uses (eq. 4; :func:`genalign.algorithms.kl.kl_k3`), and ``eps_high > eps_low`` is
DAPO's "clip-higher" (Yu et al. 2025, eq. 10). How the per-token terms become one loss differs
between methods, and it changes what the gradient favours (Liu et al. 2025, "Understanding R1-Zero-
Like Training", the Dr. GRPO paper, Sec. 3.1):

* ``"sequence_mean"``: each sequence's mean over its completion tokens, then the mean over
  sequences (GRPO eq. 3; UniRL's PromptRL trainer and trl's GRPO default, see
  ``../shared/METHODS.md``);
* ``"token_mean"``: the sum over every completion token of the batch over their count (DAPO eq. 10:
  long completions weigh more);
* ``"constant"``: the sum over every completion token over ``batch size * max_tokens``, a
  constant (Dr. GRPO: no length normalisation, so no length bias).

This module is the math only; the ``token_ppo`` loss of the ``language`` policy family (issue #24)
is what calls it.
"""

from __future__ import annotations

from typing import Literal

import torch

from genalign.algorithms.kl import kl_k3
from genalign.algorithms.losses import clip_bounds

TokenAggregation = Literal["sequence_mean", "token_mean", "constant"]
TOKEN_AGGREGATIONS: tuple[str, ...] = ("sequence_mean", "token_mean", "constant")

__all__ = ["TOKEN_AGGREGATIONS", "aggregate_tokens", "token_ppo_loss"]


def aggregate_tokens(
    values: torch.Tensor,
    mask: torch.Tensor,
    aggregation: TokenAggregation = "sequence_mean",
    max_tokens: int | None = None,
) -> torch.Tensor:
    """One scalar from per-token ``values`` ``[B, T]`` over the completion ``mask`` ``[B, T]``.

    ``aggregation`` as in the module docstring; ``"constant"`` divides by ``B * max_tokens``
    (default: ``T``, the padded length). A sequence with no completion token adds 0 to the
    ``"sequence_mean"`` numerator but still counts in its ``B`` (it has no tokens to weigh).
    """
    if values.shape != mask.shape or values.ndim != 2:
        raise ValueError(
            f"values and mask must both be [B, T], got {tuple(values.shape)} and {tuple(mask.shape)}"
        )
    mask = mask.to(values.dtype)
    masked = values * mask
    if aggregation == "sequence_mean":
        per_sequence = masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return per_sequence.mean()
    if aggregation == "token_mean":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if aggregation == "constant":
        length = values.shape[1] if max_tokens is None else max_tokens
        if length <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        return masked.sum() / (values.shape[0] * length)
    raise ValueError(f"aggregation must be one of {TOKEN_AGGREGATIONS}, got {aggregation!r}")


def token_ppo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    clip_range: float | tuple[float, float] = 0.2,
    ref_log_probs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    aggregation: TokenAggregation = "sequence_mean",
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The token-level clipped surrogate plus ``kl_coef`` times k3 (module docstring).

    Args:
        log_probs: ``[B, T]`` per-token log-probabilities under the current parameters (gradients).
        old_log_probs: ``[B, T]`` the same tokens' log-probabilities when sampled (constants); on
            the first pass over fresh rollouts they equal ``log_probs`` and the ratio is 1.
        advantages: ``[B]`` one advantage per sequence (constants), or ``[B, T]`` per token.
        completion_mask: ``[B, T]`` 1 on completion tokens (EOS included), 0 on prompt and padding.
        clip_range: ``eps`` or ``(eps_low, eps_high)``.
        ref_log_probs: ``[B, T]`` the reference model's log-probabilities; needed when
            ``kl_coef > 0``.
        kl_coef: ``beta`` of the k3 penalty.
        aggregation, max_tokens: see :func:`aggregate_tokens`.

    Returns:
        ``(loss, info)``: ``info`` holds detached scalars over completion tokens: ``ratio`` (mean),
        ``clipfrac``, ``approx_kl`` (``0.5 * mean((log rho)^2)``), ``kl`` (mean k3, when a reference
        is given) and ``policy_loss`` (the surrogate without the penalty, aggregated the same way).
    """
    if (
        log_probs.ndim != 2
        or old_log_probs.shape != log_probs.shape
        or completion_mask.shape != log_probs.shape
    ):
        raise ValueError(
            "log_probs, old_log_probs and completion_mask must share one [B, T] shape, got "
            f"{tuple(log_probs.shape)}, {tuple(old_log_probs.shape)} and {tuple(completion_mask.shape)}"
        )
    low, high = clip_bounds(clip_range)
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0 and ref_log_probs is None:
        raise ValueError("kl_coef > 0 needs ref_log_probs")
    advantages = advantages.detach().float()
    if advantages.ndim == 1:
        if advantages.shape[0] != log_probs.shape[0]:
            raise ValueError(
                f"advantages must be [B] = [{log_probs.shape[0]}], got {tuple(advantages.shape)}"
            )
        advantages = advantages[:, None]
    elif advantages.shape != log_probs.shape:
        raise ValueError(
            f"per-token advantages must be {tuple(log_probs.shape)}, got {tuple(advantages.shape)}"
        )

    new = log_probs.float()
    log_ratio = new - old_log_probs.detach().float()
    ratio = torch.exp(log_ratio)
    surrogate = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high))
    per_token = surrogate
    k3 = None
    if ref_log_probs is not None:
        k3 = kl_k3(new, ref_log_probs.detach().float())
        if kl_coef > 0:
            per_token = surrogate + kl_coef * k3
    loss = aggregate_tokens(per_token, completion_mask, aggregation, max_tokens)

    with torch.no_grad():
        mask = completion_mask.bool()
        count = mask.sum().clamp(min=1)
        clipped = ((ratio < 1.0 - low) | (ratio > 1.0 + high)) & mask
        info = {
            "ratio": (ratio * mask).sum() / count,
            "clipfrac": clipped.sum() / count,
            "approx_kl": 0.5 * ((log_ratio**2) * mask).sum() / count,
            "policy_loss": aggregate_tokens(surrogate.detach(), completion_mask, aggregation, max_tokens),
        }
        if k3 is not None:
            info["kl"] = (k3 * mask).sum() / count
    return loss, info
