"""Verifiable rewards on text: scores computed from a language policy's completions by a rule.

These score what a ``language`` policy writes (``input_kind = "text"``: a list of B strings in
place of images), so a language-only GRPO run (DeepSeekMath's GRPO, Shao et al. 2024, trained on
rule-checked answers) can be tested and demonstrated offline with no reward model:

* ``keyword`` — :class:`KeywordReward`: how many of the keywords a completion contains (a
  verifiable rule like PromptRL's format reward, "1 if an ``<answer>`` tag is present");
* ``text_length`` — :class:`TextLengthReward`: closeness of a completion's length to a target.

Neither is differentiable; an empty completion is a valid input (score 0 / the length penalty).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from genalign.rewards.base import Reward, RewardOutput, register_reward

__all__ = ["KeywordReward", "TextLengthReward"]


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
