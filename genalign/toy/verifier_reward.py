"""What the toy world's verifiers share as rewards (ShapesEval on images,
:class:`~genalign.toy.shapes_eval.ShapesEvalReward`; the video verifier on videos,
:class:`~genalign.toy.video.reward.ToyVideoEvalReward`): each prompt's spec, the 0/1 or partial
score and the per-sample details."""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence
from typing import Any

import torch

from genalign.rewards.base import Reward, RewardOutput
from genalign.toy.captions import CaptionParseError, Spec

__all__ = ["VerifierReward"]


class VerifierReward(Reward, abc.ABC):
    """A toy verifier as a reward: 1.0 when the sample satisfies its prompt's spec, else 0.0; with
    ``partial=True`` the fraction of atomic checks passed (1.0 exactly when the sample is correct).

    The spec comes from ``metadata["specs"]`` (one per sample) or, when absent, from parsing each
    prompt; a prompt outside the grammar scores 0.0 and is counted in ``details["unparsed_count"]``.
    ``details``: ``correct`` ``[B]`` (0/1), ``partial`` ``[B]``, ``category``, ``reasons``, what
    the verifier found per sample (under :attr:`found_key`) and ``unparsed_count``.

    ``config``: the verifier's (:attr:`config_type`; default its defaults). A subclass reads a given
    spec (:meth:`spec_of`), parses a prompt (:meth:`parse`) and checks one sample (:meth:`check`).
    """

    differentiable = False
    config_type: type  # the verifier's configuration, default-constructed when none is given
    found_key: str = "found"  # the details' name of what the verifier found in each sample
    grammar: str = "grammar"  # the prompts' grammar, as the messages name it

    def __init__(self, partial: bool = False, config: Any | None = None, strict: bool = False) -> None:
        super().__init__(strict=strict)
        self.partial = partial
        self.config = config or self.config_type()

    # -- to implement -------------------------------------------------------------------------------
    @abc.abstractmethod
    def spec_of(self, item: Any) -> Spec:
        """A validated spec from an item of ``metadata["specs"]`` (a spec dict or a prompt spec)."""

    @abc.abstractmethod
    def parse(self, prompt: str) -> Spec:
        """The spec of a prompt; raises :class:`CaptionParseError` outside the grammar."""

    @abc.abstractmethod
    def check(self, sample: torch.Tensor, spec: Spec) -> tuple[Any, list[dict[str, Any]]]:
        """The verdict on one sample (``correct``, ``fraction``, ``reasons``) and what was found."""

    # -- shared -------------------------------------------------------------------------------------
    def _specs(self, prompts: Sequence[str], specs: Sequence[Any] | None) -> list[Spec | None]:
        if specs is not None:
            if len(specs) != len(prompts):
                raise ValueError(f"{self.name}: got {len(prompts)} prompts but {len(specs)} specs")
            return [self.spec_of(item) for item in specs]
        parsed: list[Spec | None] = []
        for prompt in prompts:
            try:
                parsed.append(self.parse(prompt))
            except CaptionParseError as error:
                self._logger.debug("%s cannot parse %r: %s", self.name, prompt, error)
                parsed.append(None)
        return parsed

    @property
    def _logger(self) -> logging.Logger:
        return logging.getLogger(type(self).__module__)

    def score(self, images: torch.Tensor, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        specs = self._specs(prompts, metadata.get("specs"))
        correct, partial, categories, reasons, found = [], [], [], [], []
        for sample, spec in zip(images, specs):
            if spec is None:
                correct.append(0.0)
                partial.append(0.0)
                categories.append(None)
                reasons.append([f"prompt outside the {self.grammar}"])
                found.append([])
                continue
            check, sample_found = self.check(sample, spec)
            correct.append(float(check.correct))
            partial.append(check.fraction)
            categories.append(spec["tag"])
            reasons.append(check.reasons)
            found.append(sample_found)
        unparsed = sum(spec is None for spec in specs)
        if unparsed:
            self._logger.warning(
                "%s: %d of %d prompts are outside the %s", self.name, unparsed, len(specs), self.grammar
            )
        correct_t = torch.tensor(correct, dtype=torch.float32, device=images.device)
        partial_t = torch.tensor(partial, dtype=torch.float32, device=images.device)
        details = {
            "correct": correct_t,
            "partial": partial_t,
            "category": categories,
            "reasons": reasons,
            self.found_key: found,
            "unparsed_count": unparsed,
        }
        return RewardOutput(partial_t if self.partial else correct_t, details)

    def extra_repr(self) -> str:
        return f"partial={self.partial}"
