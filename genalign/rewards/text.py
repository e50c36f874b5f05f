"""Verifiable rewards on text: scores computed from a language policy's completions by a rule.

These score what a ``language`` policy writes (``input_kind = "text"``: a list of B strings in
place of images), so a language-only GRPO run (DeepSeekMath's GRPO, Shao et al. 2024, trained on
rule-checked answers) can be tested and demonstrated offline with no reward model:

* ``keyword`` — :class:`KeywordReward`: how many of the keywords a completion contains (a
  verifiable rule like PromptRL's format reward, "1 if an ``<answer>`` tag is present");
* ``text_length`` — :class:`TextLengthReward`: closeness of a completion's length to a target;
* ``iqa_answer`` — :class:`IQAAnswerReward`: Q-Hawkeye's accuracy + format + repetition reward on
  an IQA judge's ``<think>...</think><answer>x.xx</answer>`` against the true MOS.

None is differentiable; an empty completion is a valid input (score 0 / the length penalty).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from genalign.algorithms.q_hawkeye import (
    accuracy_reward,
    format_reward,
    parse_answer_score,
    repetition_penalty,
)
from genalign.rewards.base import Reward, RewardOutput, register_reward

__all__ = ["IQAAnswerReward", "KeywordReward", "TextLengthReward"]


@register_reward("keyword")
class KeywordReward(Reward):
    """Keyword occurrences in each completion, in [0, 1].

    ``mode="fraction"``: the fraction of ``keywords`` present at least once; ``mode="count"``:
    ``min(total occurrences of all keywords, cap) / cap``, a denser signal for a policy that rarely
    writes a keyword at first. Matching is on substrings, case-insensitive unless
    ``case_sensitive``. Prompts are ignored. ``details``: ``keyword_hits`` ``[B]`` (occurrences).
    """

    input_kind = "text"

    def __init__(
        self,
        keywords: Sequence[str] = ("red",),
        mode: Literal["fraction", "count"] = "count",
        cap: int = 4,
        case_sensitive: bool = False,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        if isinstance(keywords, str) or not keywords or not all(isinstance(k, str) and k for k in keywords):
            raise ValueError(f"keywords must be a non-empty list of non-empty strings, got {keywords!r}")
        if mode not in ("fraction", "count"):
            raise ValueError(f"mode must be 'fraction' or 'count', got {mode!r}")
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        self.case_sensitive = case_sensitive
        self.keywords = [k if case_sensitive else k.lower() for k in keywords]
        self.mode = mode
        self.cap = int(cap)

    def score(self, texts: Sequence[str], prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        scores, hits = [], []
        for text in texts:
            text = text if self.case_sensitive else text.lower()
            counts = [text.count(keyword) for keyword in self.keywords]
            hits.append(sum(counts))
            if self.mode == "fraction":
                scores.append(sum(c > 0 for c in counts) / len(self.keywords))
            else:
                scores.append(min(sum(counts), self.cap) / self.cap)
        return RewardOutput(
            torch.tensor(scores, dtype=torch.float32),
            {"keyword_hits": torch.tensor(hits, dtype=torch.float32)},
        )


@register_reward("text_length")
class TextLengthReward(Reward):
    """``1 - |length - target| / target``, floored at ``-1``: 1 at the target length.

    ``unit``: ``"characters"`` or ``"words"`` (whitespace-separated). Prompts are ignored.
    ``details``: ``length`` ``[B]``.
    """

    input_kind = "text"

    def __init__(
        self, target: int = 16, unit: Literal["characters", "words"] = "characters", strict: bool = False
    ) -> None:
        super().__init__(strict=strict)
        if target < 1:
            raise ValueError(f"target must be >= 1, got {target}")
        if unit not in ("characters", "words"):
            raise ValueError(f"unit must be 'characters' or 'words', got {unit!r}")
        self.target = int(target)
        self.unit = unit

    def score(self, texts: Sequence[str], prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        lengths = torch.tensor(
            [len(text) if self.unit == "characters" else len(text.split()) for text in texts],
            dtype=torch.float32,
        )
        scores = (1.0 - (lengths - self.target).abs() / self.target).clamp(min=-1.0)
        return RewardOutput(scores, {"length": lengths})


@register_reward("iqa_answer")
class IQAAnswerReward(Reward):
    """Q-Hawkeye's reward on an IQA judge's completion (Xie et al. 2026, arXiv 2601.22920; official
    ``grpo_am.py``): ``accuracy + format + repetition`` (:mod:`genalign.algorithms.q_hawkeye`).

    * accuracy: ``exp(-|s_hat - mos| / tau)`` with ``s_hat`` parsed from ``<answer>x.xx</answer>``
      and both clamped to ``[score_min, score_max]``; 0 when no score parses;
    * format: ``format_value`` (0.8) when the completion is ``<think>...</think><answer>x.xx</answer>``;
    * repetition: ``-0.25`` per occurrence of a word or character occurring more than 5 times in the
      answer, floored at -2.

    Metadata: ``mos`` ``[B]`` (a tensor or list), the true mean opinion score of each sample's image
    (the ``q_hawkeye`` strategy passes its pool row's). ``weights`` scales the three terms
    (official: all 1). ``details``: per-sample ``accuracy``, ``format``, ``repetition`` and
    ``parsed_score`` (NaN: unparsed), their means (``accuracy_mean``, ``format_mean``,
    ``repetition_mean``) and ``unparsed_count``. A malformed answer scores the floor of each term,
    never raises.
    """

    input_kind = "text"

    def __init__(
        self,
        tau: float = 0.3,
        score_min: float = 1.0,
        score_max: float = 5.0,
        format_value: float = 0.8,
        weights: dict[str, float] | None = None,
        strict: bool = False,
    ) -> None:
        super().__init__(strict=strict)
        if tau <= 0 or score_max <= score_min:
            raise ValueError(f"need tau > 0 and score_max > score_min, got {tau}, [{score_min}, {score_max}]")
        self.weights = {"accuracy": 1.0, "format": 1.0, "repetition": 1.0, **(weights or {})}
        unknown = sorted(set(self.weights) - {"accuracy", "format", "repetition"})
        if unknown:
            raise ValueError(f"weights: unknown terms {unknown}; the terms are accuracy, format, repetition")
        self.tau, self.score_min, self.score_max, self.format_value = tau, score_min, score_max, format_value

    def score(self, texts: Sequence[str], prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        if "mos" not in metadata:
            raise ValueError(f"{self.name}: needs metadata 'mos' (the true score of each sample's image)")
        mos = torch.as_tensor(metadata["mos"], dtype=torch.float64).flatten().tolist()
        if len(mos) != len(texts):
            raise ValueError(f"{self.name}: got {len(mos)} mos values for {len(texts)} completions")
        terms = {
            "accuracy": [
                accuracy_reward(t, m, self.tau, self.score_min, self.score_max) for t, m in zip(texts, mos)
            ],
            "format": [format_reward(t, self.format_value) for t in texts],
            "repetition": [repetition_penalty(t) for t in texts],
        }
        details: dict[str, Any] = {k: torch.tensor(v, dtype=torch.float32) for k, v in terms.items()}
        scores = sum(self.weights[k] * details[k] for k in terms)
        parsed = [parse_answer_score(t) for t in texts]
        details["parsed_score"] = torch.tensor([float("nan") if p is None else p for p in parsed])
        details["unparsed_count"] = sum(p is None for p in parsed)
        for key in terms:
            details[f"{key}_mean"] = float(details[key].mean()) if texts else 0.0
        return RewardOutput(scores.float(), details)
