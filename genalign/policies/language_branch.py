"""Greedy answers and one-token branches off them: the rollouts of ``train.svg.rollout: branch``.

A language policy's greedy answer ``g`` is what an evaluation decodes. To learn which single
decisions would improve it, each branch follows ``g`` up to a position ``i``, draws token ``i``
from the policy at temperature ``T`` *without* ``g_i``, and finishes greedily. The reward of that
completion against the reward of ``g`` is then the value of one alternative decision under the
greedy continuation, ``Q(s_i, a) - Q(s_i, g_i)``, with no sampling noise in the tail. With the
position drawn with probability proportional to ``1 - pi_T(g_i | s_i)`` (the mass of the
alternatives), the sampled ``grad log pi_T(a | s_i) (Q(s_i, a) - Q(s_i, g_i))`` is, in expectation,
proportional to ``sum_i grad E_{a ~ pi_T(s_i)} Q(s_i, a)`` over the greedy answer's states: the
restriction to ``a != g_i`` divides by ``1 - pi_T(g_i)``, which the position weights cancel, and
the term of ``a = g_i`` is 0 against that baseline.

Rollouts from intermediate states for per-step credit are VinePPO's (Kazemnejad et al. 2024,
arXiv 2410.01679), which estimates values by sampled continuations; prefix-rl (darknoon/prefix-rl)
branches SVG rollouts off shared prefixes. A single greedy continuation as the value of a
decision is our variant (docs/fidelity.md, "RLRF"), chosen because the evaluation is greedy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from genalign.policies.language_sampling import gumbel_max_tokens, suppress_tokens

__all__ = ["BranchSampler", "branch_positions"]

_LCG_MULTIPLIER = 6364136223846793005  # Knuth's MMIX constants: a position seed apart from the token's
_LCG_INCREMENT = 1442695040888963407


@dataclass
class BranchSampler:
    """A ``sampler`` for :meth:`LanguagePolicy.rollout`: row ``b`` copies ``reference[b]`` (its
    completion tokens ``[B, L']``) before ``positions[b]``, draws the token at ``positions[b]`` from
    ``softmax(logits / temperature)`` with the reference token removed (the row's own generator),
    and takes the argmax after. Without a reference (or at position -1) the row is the greedy
    answer: the argmax everywhere."""

    reference: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if (self.reference is None) != (self.positions is None):
            raise ValueError("BranchSampler needs both reference and positions, or neither")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")

    def __call__(
        self, generators: Sequence[torch.Generator], prompt_length: int, suppressed: Sequence[int]
    ) -> _BranchProcessor:
        return _BranchProcessor(self, list(generators), prompt_length, list(suppressed))


@dataclass
class _BranchProcessor:
    """The ``generate`` logits processor of :class:`BranchSampler`: the chosen token is the only
    finite score, so greedy search emits it."""

    sampler: BranchSampler
    generators: list[torch.Generator]
    prompt_length: int
    suppressed: list[int]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = suppress_tokens(scores, self.suppressed)
        tokens = scores.argmax(dim=-1)
        step = input_ids.shape[1] - self.prompt_length
        reference, positions = self.sampler.reference, self.sampler.positions
        if reference is not None and step < reference.shape[1]:
            positions = positions.to(scores.device)
            copied = reference[:, step].to(scores.device)
            tokens = torch.where(step < positions, copied, tokens)
            for row in (positions == step).nonzero().flatten().tolist():
                logits = scores[row].float() / self.sampler.temperature
                logits[copied[row]] = float("-inf")
                tokens[row] = gumbel_max_tokens(logits[None], 1.0, [self.generators[row]])[0]
        chosen = torch.full_like(scores, float("-inf"))
        chosen.scatter_(1, tokens[:, None], 0.0)
        return chosen


def branch_positions(log_probs: torch.Tensor, mask: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """``[B]`` long: one branch position per row of the greedy answers' token log-probs
    ``[B, L]`` at the sampling temperature, drawn with probability proportional to
    ``1 - exp(log_prob)`` over ``mask`` (uniformly over ``mask`` where every token is certain;
    -1 for a row with no token), from a generator seeded by a function of the row's seed."""
    weights = (1.0 - log_probs.detach().float().exp()).clamp(min=0.0) * mask.float()
    positions = torch.full((log_probs.shape[0],), -1, dtype=torch.long)
    for row, seed in enumerate(seeds.tolist()):
        w = weights[row] if weights[row].sum() > 0 else mask[row].float()
        if w.sum() <= 0:
            continue
        generator = torch.Generator().manual_seed((int(seed) * _LCG_MULTIPLIER + _LCG_INCREMENT) % 2**63)
        positions[row] = int(torch.multinomial(w.cpu(), 1, generator=generator))
    return positions
