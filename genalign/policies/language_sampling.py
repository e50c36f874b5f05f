"""Token sampling for the ``language`` family: seeded Gumbel-max draws, optionally truncated to
top-k / top-p, through ``generate``'s logits processors, and the masks around them
(:mod:`genalign.policies.language` explains the contract: per-sample seeds, log-probs recomputed by a
teacher-forced forward that replays the same suppression and truncation).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from genalign.algorithms.token_truncation import truncate_logits

__all__ = [
    "SeededSampler",
    "completion_mask_after_eos",
    "gumbel_max_tokens",
    "own_generation_config",
    "suppress_tokens",
]


def completion_mask_after_eos(completion_ids: torch.Tensor, eos_token_ids: Sequence[int]) -> torch.Tensor:
    """``[B, L]`` long: 1 up to and including each row's first end-of-sequence token, 0 after.

    A row without one is all 1 (it ran out of ``max_new_tokens``). The first EOS decides, not the
    pad id: many tokenizers pad with an EOS token (Qwen2.5's pad is ``<|endoftext|>``).
    """
    eos = torch.tensor(list(eos_token_ids), device=completion_ids.device)
    is_eos = torch.isin(completion_ids, eos).long()  # (B, L)
    eos_before = is_eos.cumsum(dim=1) - is_eos  # EOS tokens strictly before each position
    return (eos_before == 0).long()


def gumbel_max_tokens(
    logits: torch.Tensor, temperature: float, generators: Sequence[torch.Generator]
) -> torch.Tensor:
    """One token per row of ``logits`` ``[B, V]`` drawn from ``softmax(logits / T)`` by Gumbel-max,
    row ``b`` with its own ``generators[b]`` (V uniforms per row and call). Returns ``[B]`` long."""
    scaled = logits.float() / temperature
    tokens = []
    for row, generator in zip(scaled, generators, strict=True):
        uniform = torch.rand(row.shape[0], generator=generator, device=generator.device).to(row.device)
        gumbel = -torch.log(-torch.log(uniform.clamp(min=1e-20, max=1.0 - 1e-7)))
        tokens.append(torch.argmax(row + gumbel))
    return torch.stack(tokens)


class SeededSampler:
    """A ``generate`` logits processor: every row's next token is drawn by :func:`gumbel_max_tokens`
    (from the tempered softmax truncated to ``top_k`` / ``top_p`` when set) and made the only
    finite score, so greedy search emits exactly the drawn tokens."""

    def __init__(
        self,
        generators: Sequence[torch.Generator],
        temperature: float,
        suppressed: Sequence[int] = (),
        top_k: int | None = None,
        top_p: float | None = None,
    ) -> None:
        self.generators = list(generators)
        self.temperature = temperature
        self.suppressed = list(suppressed)
        self.top_k, self.top_p = top_k, top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = suppress_tokens(scores, self.suppressed)
        if self.top_k is None and self.top_p is None:
            tokens = gumbel_max_tokens(scores, self.temperature, self.generators)
        else:
            scaled = truncate_logits(scores.float() / self.temperature, self.top_k, self.top_p)
            tokens = gumbel_max_tokens(scaled, 1.0, self.generators)
        chosen = torch.full_like(scores, float("-inf"))
        chosen.scatter_(1, tokens[:, None].to(scores.device), 0.0)
        return chosen


def suppress_tokens(logits: torch.Tensor, token_ids: Sequence[int]) -> torch.Tensor:
    """``logits`` with the last dimension's ``token_ids`` at -inf (out of place; unchanged if none).

    A VLM's image placeholder (``<image>``) must never be sampled: a completion holding one would
    make the re-scoring forward expect image features that do not exist. Sampling and every
    recomputed log-prob suppress the same ids, so the recorded distribution is the one re-scored.
    """
    if not token_ids:
        return logits
    index = torch.tensor(list(token_ids), device=logits.device)
    return logits.index_fill(-1, index, float("-inf"))


@contextlib.contextmanager
def own_generation_config(model: Any, config: Any) -> Iterator[None]:
    """Inside the block the model's ``generation_config`` is ``config``, so ``generate`` fills no
    field of ours from the checkpoint's own (transformers copies every unset field from it). A
    checkpoint's ``repetition_penalty`` (Qwen2.5 Instruct ships 1.05), ``no_repeat_ngram_size``,
    ``min_new_tokens`` or ``suppress_tokens`` would otherwise reshape the logits before our sampler,
    and tokens would be drawn from another distribution than the recorded ``log_softmax(logits /
    T)``. ``model`` may be wrapped by peft: its base model is the one ``generate`` reads."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    saved = getattr(base, "generation_config", None)
    base.generation_config = config
    try:
        yield
    finally:
        base.generation_config = saved
