"""The toy video verifier as a reward (or a monitor beside a learned video reward).

``load_reward("toy_video_eval")`` scores videos ``[B, F, 3, H, W]`` in [0, 1] (the ``ar_video``
layout): 1.0 when the video satisfies its prompt's spec (``genalign.toy.video.verifier``), else 0.0;
with ``partial=True`` the fraction of atomic checks passed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from genalign.rewards.base import Reward, RewardOutput, register_reward
from genalign.toy.captions import CaptionParseError, Spec
from genalign.toy.video.captions import parse_video_caption, validate_video_spec
from genalign.toy.video.verifier import VideoVerifierConfig, check_video_spec, detect_video

logger = logging.getLogger(__name__)


@register_reward("toy_video_eval")
class ToyVideoEvalReward(Reward):
    """The toy video verifier as a reward: 0/1 correctness, or with ``partial=True`` the fraction
    of checks passed (presence, colour, motion, relation per clause).

    The spec comes from ``metadata["specs"]`` (dicts or ``VideoPromptSpec`` s, one per video) or,
    when absent, from parsing each prompt (:func:`parse_video_caption`); a prompt outside the
    grammar scores 0.0 and is counted in ``details["unparsed_count"]``. ``details``: ``correct``
    ``[B]``, ``partial`` ``[B]``, ``category``, ``reasons``, ``tracks`` (per video, the tracks'
    shape, colour, frames, motion and velocity). Not differentiable.
    """

    differentiable = False
    input_kind = "video"

    def __init__(
        self, partial: bool = False, config: VideoVerifierConfig | None = None, strict: bool = False
    ) -> None:
        super().__init__(strict=strict)
        self.partial = partial
        self.config = config or VideoVerifierConfig()

    def _specs(self, prompts: Sequence[str], specs: Sequence[Any] | None) -> list[Spec | None]:
        if specs is not None:
            if len(specs) != len(prompts):
                raise ValueError(f"{self.name}: got {len(prompts)} prompts but {len(specs)} specs")
            out = [getattr(item, "spec", item) for item in specs]
            for spec in out:
                validate_video_spec(spec)
            return out
        parsed: list[Spec | None] = []
        for prompt in prompts:
            try:
                parsed.append(parse_video_caption(prompt))
            except CaptionParseError as error:
                logger.debug("toy_video_eval cannot parse %r: %s", prompt, error)
                parsed.append(None)
        return parsed

    def score(self, images: torch.Tensor, prompts: Sequence[str], **metadata: Any) -> RewardOutput:
        specs = self._specs(prompts, metadata.get("specs"))
        correct, partial, categories, reasons, tracks = [], [], [], [], []
        for video, spec in zip(images, specs):
            if spec is None:
                correct.append(0.0)
                partial.append(0.0)
                categories.append(None)
                reasons.append(["prompt outside the toy video grammar"])
                tracks.append([])
                continue
            found = detect_video(video.detach().float().cpu(), self.config)
            check = check_video_spec(found, spec, int(video.shape[0]), self.config)
            correct.append(float(check.correct))
            partial.append(check.fraction)
            categories.append(spec["tag"])
            reasons.append(check.reasons)
            tracks.append([track.to_dict() for track in found])
        unparsed = sum(spec is None for spec in specs)
        if unparsed:
            logger.warning("toy_video_eval: %d of %d prompts are outside the grammar", unparsed, len(specs))
        correct_t = torch.tensor(correct, dtype=torch.float32, device=images.device)
        partial_t = torch.tensor(partial, dtype=torch.float32, device=images.device)
        details = {
            "correct": correct_t,
            "partial": partial_t,
            "category": categories,
            "reasons": reasons,
            "tracks": tracks,
            "unparsed_count": unparsed,
        }
        return RewardOutput(partial_t if self.partial else correct_t, details)

    def extra_repr(self) -> str:
        return f"partial={self.partial}"
