"""Top-k and top-p (nucleus) truncation of a token distribution, replayed wherever its log-probs are
recomputed.

Sampling keeps only part of ``softmax(logits / T)`` and renormalises it:

* **top-k** keeps the ``k`` largest logits (every token tied with the k-th is kept too, as
  transformers' ``TopKLogitsWarper`` does);
* **top-p** (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", section 3.1)
  keeps the smallest set of most probable tokens whose mass reaches ``p``: a token is kept when
  the mass of the tokens ranked before it is below ``p``, so the most probable token always is.

Both together apply top-k first and top-p on the top-k distribution renormalised (transformers'
and vLLM's order). A policy gradient or importance ratio over such samples must score them under
the same truncated distribution: scoring under the full softmax multiplies every ratio by the kept
mass of its position (trl issue #6789; NeMo RL and prime-rl replay the truncation on the trainer
side). :func:`truncate_logits` does that replay; its ``keep`` argument puts the sampled token back
into the support when the recomputed logits rank it just outside (the sampling forward and the
teacher-forced one round differently; prime-rl restores the label's logit the same way), so a
recorded token never gets log-prob ``-inf``.

The mask is computed without gradient; gradients flow through the kept logits only.
"""

from __future__ import annotations

import torch

__all__ = ["truncate_logits", "truncation_mask", "validate_truncation"]

_CHUNK_ELEMENTS = 1 << 24  # logits per sort: 64 MiB of fp32 and 128 MiB of indices


def validate_truncation(top_k: int | None, top_p: float | None) -> None:
    """Raise ValueError (naming the setting and its value) unless ``top_k`` is None or a positive
    int and ``top_p`` None or a number in (0, 1]."""
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0):
        raise ValueError(f"top_k must be a positive integer (or unset), got {top_k!r}")
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1
    ):
        raise ValueError(f"top_p must be in (0, 1] (or unset), got {top_p!r}")


@torch.no_grad()
def truncation_mask(
    logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Bool ``[..., V]``: the tokens that top-k then top-p keep of ``softmax(logits)`` over the last
    dimension (``logits`` already divided by the temperature; -inf entries are never kept)."""
    validate_truncation(top_k, top_p)
    flat = logits.detach().reshape(-1, logits.shape[-1])
    rows = max(1, _CHUNK_ELEMENTS // max(1, flat.shape[1]))  # bounds the sort's memory
    chunks = [_mask_rows(flat[i : i + rows].float(), top_k, top_p) for i in range(0, flat.shape[0], rows)]
    return torch.cat(chunks).reshape(logits.shape) if chunks else torch.ones_like(logits, dtype=torch.bool)


def _mask_rows(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    keep = torch.isfinite(logits)
    vocab = logits.shape[-1]
    if top_k is not None and top_k < vocab:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        keep &= logits >= kth
    if top_p is not None and top_p < 1:
        probs = torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=-1)
        ranked, order = probs.sort(dim=-1, descending=True, stable=True)
        before = ranked.cumsum(dim=-1) - ranked  # mass of the tokens ranked before each
        kept = before < top_p
        kept[..., 0] = True
        keep &= torch.zeros_like(keep).scatter(-1, order, kept)
    return keep


def truncate_logits(
    logits: torch.Tensor,
    top_k: int | None = None,
    top_p: float | None = None,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """``logits`` ``[..., V]`` with every token that :func:`truncation_mask` drops set to -inf (out
    of place; unchanged when neither ``top_k`` nor ``top_p`` truncates); ``keep`` ``[...]`` long:
    one token per row that stays at its own logit whatever its rank (the sampled token)."""
    if top_k is None and (top_p is None or top_p >= 1):
        validate_truncation(top_k, top_p)
        return logits
    mask = truncation_mask(logits, top_k, top_p)
    if keep is not None:
        mask = mask.scatter(-1, keep.to(mask.device)[..., None], True)
    return logits.masked_fill(~mask, float("-inf"))
