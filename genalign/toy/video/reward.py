"""The toy video verifier as a reward (or a monitor beside a learned video reward).

``load_reward("toy_video_eval")`` scores videos ``[B, F, 3, H, W]`` in [0, 1] (the ``ar_video``
layout): 1.0 when the video satisfies its prompt's spec (``genalign.toy.video.verifier``), else 0.0;
with ``partial=True`` the fraction of atomic checks passed.
"""

from __future__ import annotations

from typing import Any

import torch

from genalign.rewards.base import register_reward
from genalign.toy.captions import Spec
from genalign.toy.verifier_reward import VerifierReward
from genalign.toy.video.captions import parse_video_caption, validate_video_spec
from genalign.toy.video.verifier import VideoSpecCheck, VideoVerifierConfig, check_video_spec, detect_video


@register_reward("toy_video_eval")
class ToyVideoEvalReward(VerifierReward):
    """The toy video verifier as a reward: 0/1 correctness, or with ``partial=True`` the fraction
    of checks passed (presence, colour, motion, relation per clause).

    The spec comes from ``metadata["specs"]`` (dicts or ``VideoPromptSpec`` s, one per video) or,
    when absent, from parsing each prompt (:func:`parse_video_caption`); a prompt outside the
    grammar scores 0.0 and is counted in ``details["unparsed_count"]``. ``details``: ``correct``
    ``[B]``, ``partial`` ``[B]``, ``category``, ``reasons``, ``tracks`` (per video, the tracks'
    shape, colour, frames, motion and velocity). Not differentiable.
    """

    input_kind = "video"
    config_type = VideoVerifierConfig
    found_key = "tracks"
    grammar = "toy video grammar"

    def spec_of(self, item: Any) -> Spec:
        spec = getattr(item, "spec", item)
        validate_video_spec(spec)
        return spec

    def parse(self, prompt: str) -> Spec:
        return parse_video_caption(prompt)

    def check(self, sample: torch.Tensor, spec: Spec) -> tuple[VideoSpecCheck, list[dict[str, Any]]]:
        found = detect_video(sample.detach().float().cpu(), self.config)
        check = check_video_spec(found, spec, int(sample.shape[0]), self.config)
        return check, [track.to_dict() for track in found]
